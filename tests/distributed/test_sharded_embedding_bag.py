"""Sharded EmbeddingBagCollection on real gloo ranks matches the unsharded collection on the global batch.

Every rank builds the same unsharded collection (same seed), keeps a deep copy as the reference, shards the
original and trains both for 5 steps: the reference on the global batch, each rank on its own slice (batch
sizes differ per rank). Outputs must agree at every step and, after training, every rank's shards must equal
the matching rectangles of the reference tables. Tolerance: 1e-5 absolute / 1e-4 relative (fp32 sums in a
different order).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rectrain.distributed.sharded.embedding_bag import ShardedEmbeddingBagCollection
from rectrain.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbOptimType, FusedOptimizerConfig, PoolingType
from tests.distributed.batches import TOL, assert_shards_match, global_batch, local_kjt
from tests.distributed.multiprocess import run_multiprocess

FEATURES = ["f_a", "f_b", "f_c", "f_d", "f_e"]
ROWS = {"f_a": 20, "f_b": 40, "f_c": 50, "f_d": 30, "f_e": 20}


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t_tw", num_embeddings=40, embedding_dim=8, feature_names=["f_a", "f_b"]),
        EmbeddingBagConfig(
            name="t_rw", num_embeddings=50, embedding_dim=8, feature_names=["f_c"], pooling=PoolingType.MEAN
        ),
        EmbeddingBagConfig(name="t_cw", num_embeddings=30, embedding_dim=24, feature_names=["f_d"]),
        EmbeddingBagConfig(name="t_dp", num_embeddings=20, embedding_dim=8, feature_names=["f_a", "f_e"]),
        EmbeddingBagConfig(name="t_twrw", num_embeddings=33, embedding_dim=8, feature_names=["f_e"]),
    ]


def _plan(kinds: dict[str, str], world_size: int, local_size: int):
    dims = {t.name: t.embedding_dim for t in _tables()}
    makers = {
        "tw": lambda table: table_wise(rank=world_size - 1),
        "rw": lambda table: row_wise(),
        # Blocks of 8 columns, dealt round-robin: a table may have two column shards on one rank.
        "cw": lambda table: column_wise(ranks=[r % world_size for r in range(dims[table] // 8)]),
        "dp": lambda table: data_parallel(),
        "twrw": lambda table: table_row_wise(host_index=world_size // local_size - 1),
    }
    return {table: makers[kind](table) for table, kind in kinds.items()}


def _train_and_compare(env, kinds: dict[str, str], optimizer: str, weighted: bool) -> int:
    torch.manual_seed(0)
    config = FusedOptimizerConfig(optimizer=EmbOptimType(optimizer), lr=0.1)
    ebc = EmbeddingBagCollection(_tables(), is_weighted=weighted, fused_optimizer=config)
    reference = copy.deepcopy(ebc)
    plan = construct_module_sharding_plan(
        ebc,
        _plan(kinds, env.world_size, env.local_world_size),
        world_size=env.world_size,
        local_size=env.local_world_size,
    )
    sharded = ShardedEmbeddingBagCollection(ebc, plan, env, torch.device("cpu"))
    batch_sizes = [3 + 2 * r for r in range(env.world_size)]
    mine = slice(sum(batch_sizes[: env.rank]), sum(batch_sizes[: env.rank + 1]))
    for step in range(5):
        lengths, values, weights = global_batch(step, ROWS, sum(batch_sizes), weighted)
        global_kjt = local_kjt(lengths, values, weights, FEATURES, 0, sum(batch_sizes))
        target = torch.randn(sum(batch_sizes), 72, generator=torch.Generator().manual_seed(step))
        expected = reference(global_kjt).values()
        # The sharded tables train on the mean of the ranks' losses (TorchRec's gradient division).
        ((expected * target).sum() / env.world_size).backward()
        got = sharded(
            local_kjt(lengths, values, weights, FEATURES, mine.start, batch_sizes[env.rank])
        ).values()
        (got * target[mine]).sum().backward()
        torch.testing.assert_close(got, expected[mine].detach(), **TOL)
    assert_shards_match(sharded.sharded_state(), reference.state_dict())
    return env.rank


MIXED = {"t_tw": "tw", "t_rw": "rw", "t_cw": "cw", "t_dp": "dp", "t_twrw": "twrw"}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_mixed_sharding_types_match_unsharded_training(world_size):
    assert run_multiprocess(_train_and_compare, world_size, MIXED, "sgd", False) == list(range(world_size))


def test_mixed_sharding_types_with_fbgemm_cpu_backward(monkeypatch):
    """Every sharded path (row-wise partial pools, column shards, data-parallel replicas) with FBGEMM's CPU
    backward forced (``auto`` runs the compiled one); the spawned ranks inherit the environment variable."""
    monkeypatch.setenv("RECTRAIN_CPU_BACKWARD", "fbgemm")
    assert run_multiprocess(_train_and_compare, 2, MIXED, "adagrad", True) == [0, 1]


# Row-wise Adagrad keeps one accumulator per row *per column shard* (as TorchRec does), so column-wise is
# checked with element-wise Adagrad, which column shards reproduce exactly.
@pytest.mark.parametrize(
    ("kind", "optimizer"),
    [("tw", "rowwise_adagrad"), ("rw", "rowwise_adagrad"), ("cw", "adagrad"), ("dp", "adam")],
)
def test_each_sharding_type_alone_weighted(kind, optimizer):
    kinds = {t: kind for t in MIXED}
    assert run_multiprocess(_train_and_compare, 2, kinds, optimizer, True) == [0, 1]


def test_table_row_wise_across_two_emulated_hosts():
    kinds = {t: "twrw" for t in MIXED}
    result = run_multiprocess(_train_and_compare, 4, kinds, "adagrad", False, local_world_size=2)
    assert result == [0, 1, 2, 3]
