"""Collections built on the meta device: DistributedModelParallel's ranks allocate only their shards, and the
initial values are a function of (seed, table, global row): the same seed gives bit-identical weights
unsharded and at 1, 2 and 3 real gloo ranks under each of the five sharding types, for collections built with
``fused_optimizer=`` and for collections built TorchRec's way (``nn.EmbeddingBag`` / ``nn.Embedding`` tables,
whose sharded kernels take the optimizer ``DistributedModelParallel`` resolved, and whose data-parallel tables
stay trainable parameters)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from rectrain.distributed.sharded.embedding import ShardedEmbeddingCollection
from rectrain.distributed.sharded.embedding_bag import ShardedEmbeddingBagCollection
from rectrain.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig
from rectrain.embedding.init import ROW_BLOCK
from tests.distributed.multiprocess import run_multiprocess

SEED = 1234
KINDS = ("tw", "rw", "cw", "dp", "twrw")
ROWS = ROW_BLOCK + 905  # crosses a block boundary, and row shards end inside blocks


def bag_tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="a", num_embeddings=ROWS, embedding_dim=12, feature_names=["f0"]),
        EmbeddingBagConfig(
            name="b", num_embeddings=37, embedding_dim=8, weight_init_min=0.25, weight_init_max=0.5
        ),
        EmbeddingBagConfig(
            name="c",
            num_embeddings=ROWS // 2,
            embedding_dim=8,
            init_fn=partial(torch.nn.init.normal_, mean=1.0, std=0.5),
        ),
    ]


def sequence_tables() -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(name="s", num_embeddings=ROWS, embedding_dim=8, feature_names=["q"]),
        EmbeddingConfig(name="u", num_embeddings=53, embedding_dim=4),
    ]


def _generator(kind: str, dim: int, world_size: int):
    makers = {
        "tw": lambda: table_wise(rank=world_size - 1),
        "rw": row_wise,
        "cw": lambda: column_wise(ranks=[r % world_size for r in range(dim // 4)]),
        "dp": data_parallel,
        "twrw": lambda: table_row_wise(host_index=0),
    }
    return makers[kind]()


def _shard(env, collection, kind: str, fused: bool):
    tables = (
        collection.embedding_bag_configs()
        if isinstance(collection, EmbeddingBagCollection)
        else collection.embedding_configs()
    )
    per_table = {t.name: _generator(kind, t.embedding_dim, env.world_size) for t in tables}
    plan = construct_module_sharding_plan(
        collection, per_table, world_size=env.world_size, local_size=env.local_world_size
    )
    cls = (
        ShardedEmbeddingBagCollection
        if isinstance(collection, EmbeddingBagCollection)
        else ShardedEmbeddingCollection
    )
    # Built TorchRec's way, the collection has no fused optimizer: DMP passes the one it resolved.
    optimizer = None if fused else FusedOptimizerConfig()
    return cls(collection, plan, env, torch.device("cpu"), fused_optimizer=optimizer)


def _local_shards(env, fused: bool) -> dict[str, list[tuple[int, int, torch.Tensor]]]:
    """Every rank's shards of both collections under each sharding type, built from meta collections."""
    found = {}
    optimizer = FusedOptimizerConfig() if fused else None
    for kind in KINDS:
        makers = [lambda: EmbeddingBagCollection(bag_tables(), device="meta", fused_optimizer=optimizer)]
        if fused or kind != "dp":  # an EmbeddingCollection built TorchRec's way has no data-parallel tables
            makers.append(
                lambda: EmbeddingCollection(sequence_tables(), device="meta", fused_optimizer=optimizer)
            )
        for make in makers:
            torch.manual_seed(SEED)
            collection = make()
            sharded = _shard(env, collection, kind, fused)
            allocated = sum(p.numel() for p in sharded.parameters())
            owned = 0
            for key, table in sharded.sharded_state().items():
                for shard, tensor in table.local_shards:
                    found.setdefault(f"{kind}/{key}", []).append(
                        (shard.row_offset, shard.col_offset, tensor.clone())
                    )
                    owned += tensor.numel()
            # Only this rank's shards exist (no table of the whole model was built on this rank).
            assert allocated == owned, (kind, allocated, owned)
    return found


@pytest.mark.parametrize(
    ("world_size", "fused"),
    [(1, True), (2, True), (3, True), (2, False), (3, False)],
    ids=["1-fused", "2-fused", "3-fused", "2-torchrec", "3-torchrec"],
)
def test_meta_built_shards_are_bit_identical_to_the_unsharded_tables(world_size, fused):
    # The unsharded reference is built the other way round (fused vs TorchRec's): one seed, the same tables.
    reference = None if fused else FusedOptimizerConfig()
    torch.manual_seed(SEED)
    bags = EmbeddingBagCollection(bag_tables(), fused_optimizer=reference).state_dict()
    torch.manual_seed(SEED)
    sequences = EmbeddingCollection(sequence_tables(), fused_optimizer=reference).state_dict()
    expected = {**bags, **sequences}
    covered = {}
    for rank_shards in run_multiprocess(_local_shards, world_size, fused):
        for name, pieces in rank_shards.items():
            kind, key = name.split("/")
            full = expected[key]
            for row, col, tensor in pieces:
                rows, cols = tensor.shape
                assert torch.equal(tensor, full[row : row + rows, col : col + cols]), (name, row, col)
                covered[name] = covered.get(name, 0) + tensor.numel()
    for kind in KINDS:
        for key, full in expected.items():
            if not fused and kind == "dp" and key in sequences:
                continue
            replicas = world_size if kind == "dp" else 1
            assert covered[f"{kind}/{key}"] == full.numel() * replicas, (kind, key)
