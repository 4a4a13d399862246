"""The two-rank gloo script of a TorchRec user, with only ``torchrec`` changed to ``rectrain`` in its imports.

It follows TorchRec's own idiom (``torchrec/distributed/test_utils/test_sharding.py``): plan with
``EmbeddingShardingPlanner`` and ``ParameterConstraints(sharding_types=[...])``, ``planner.collective_plan(
module, sharders, pg)``, ``DistributedModelParallel(module, device=..., plan=plan)``, then copy the sharded
weights out of ``dmp.state_dict()`` (``local_shards()``, ``shard.metadata.shard_offsets``, ``shard.tensor``;
or ``ShardedTensor.gather``) into an unsharded reference and compare the two models' forward on the same
batch. One run per sharding type; each type also gets a table it must shard unevenly (rows) or cannot split
(columns). The tables' optimizer is given TorchRec's way (``apply_optimizer_in_backward(RowWiseAdagrad,
...)``); data-parallel tables stay parameters that the user's optimizer steps, as TorchRec's ``dense`` kernel.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor import distribute_tensor

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.distributed.model_parallel import DistributedModelParallel
from rectrain.distributed.planner import EmbeddingShardingPlanner, Topology
from rectrain.distributed.planner.types import ParameterConstraints
from rectrain.optim.rowwise_adagrad import RowWiseAdagrad
from tests.distributed.multiprocess import run_multiprocess

SHARDING_TYPES = ["data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise"]
# (rows, dim): an uneven row count, a dim-16 table (one column shard), a dim-64 table (two column shards).
SHAPES = [(101, 16), (40, 64)]
BATCH = 4


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"table_{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"feature_{i}"]
        )
        for i, (rows, dim) in enumerate(SHAPES)
    ]


def _local_batch(rank: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(rank)
    lengths = torch.randint(0, 4, (len(SHAPES) * BATCH,), generator=gen)
    per_key = lengths.view(len(SHAPES), BATCH).sum(1).tolist()
    values = torch.cat([torch.randint(0, r, (n,), generator=gen) for (r, _), n in zip(SHAPES, per_key)])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"feature_{i}" for i in range(len(SHAPES))], values=values, lengths=lengths
    )


def _gather_state_dict(state: dict, reference: dict) -> None:
    """TorchRec's way to read a sharded state dict: each rank copies its shards, an all-reduce joins them."""
    for key, value in state.items():
        if isinstance(value, ShardedTensor):
            full = torch.zeros(value.size())
            for shard in value.local_shards():
                (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                full[row : row + rows, col : col + cols] = shard.tensor
            dist.all_reduce(full)
            reference[key].copy_(full)
        else:
            reference[key].copy_(value)


def _run(env, sharding_type: str) -> dict:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=_tables(), device=torch.device("cpu"))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    constraints = {t.name: ParameterConstraints(sharding_types=[sharding_type]) for t in _tables()}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=env.world_size, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(ebc, None, env.pg)
    dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan)

    torch.manual_seed(1)  # a different draw: the reference gets its weights only from dmp.state_dict()
    reference = EmbeddingBagCollection(tables=_tables(), device=torch.device("cpu"))
    reference_state = reference.state_dict()
    state = dmp.state_dict()
    assert sorted(state) == sorted(reference_state)
    _gather_state_dict(state, reference_state)
    reference.load_state_dict(reference_state)

    for key, value in state.items():  # TorchRec's other idiom: gather a ShardedTensor on one rank
        if isinstance(value, ShardedTensor):
            out = torch.empty(value.size()) if env.rank == 0 else None
            value.gather(dst=0, out=out)
            assert env.rank != 0 or torch.equal(out, reference_state[key])

    kjt = _local_batch(env.rank)
    got, expected = dmp(kjt), reference(kjt)
    assert got.keys() == expected.keys()
    torch.testing.assert_close(got.values(), expected.values(), atol=1e-6, rtol=1e-5)
    shards = {
        k: [s.metadata.shard_sizes for s in v.local_shards() if s.tensor.numel()]
        for k, v in state.items()
        if isinstance(v, ShardedTensor)
    }
    if sharding_type == "row_wise":
        _load_dtensors(env, dmp, reference, kjt)
    kinds = {name: p.sharding_type.value for name, p in plan.get_plan_for_module("").items()}
    # The fused optimizer (row-wise Adagrad) is keyed like TorchRec's: one [rows] accumulator per table, and
    # one per column shard laid end to end for a column-wise table.
    optimizer_state = dmp.fused_optimizer.state_dict()["state"]
    momentum = {
        key: list(optimizer_state[key][f"{key.split('.')[1]}.momentum1"].size())
        for key in sorted(optimizer_state)
    }
    trainable = [
        name for name, p in dmp.named_parameters() if p.requires_grad and "_in_backward" not in dir(p)
    ]
    return {
        "kinds": kinds,
        "types": [type(v).__name__ for v in state.values()],
        "shards": shards,
        "momentum": momentum,
        "lr": [group["lr"] for group in dmp.fused_optimizer.param_groups],
        "trainable": trainable,
    }


def _load_dtensors(env, dmp: DistributedModelParallel, reference: EmbeddingBagCollection, kjt) -> None:
    """``load_state_dict`` also takes DTensors (here row-sharded over a 1-D mesh): doubled weights give
    doubled outputs."""
    mesh = init_device_mesh("cpu", (env.world_size,))
    doubled = {k: distribute_tensor(v * 2, mesh, [DShard(0)]) for k, v in reference.state_dict().items()}
    dmp.load_state_dict(doubled)
    torch.testing.assert_close(dmp(kjt).values(), 2 * reference(kjt).values(), atol=1e-6, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("sharding_type", SHARDING_TYPES)
def test_torchrec_style_two_rank_script(sharding_type):
    results = run_multiprocess(_run, 2, sharding_type)
    for result in results:
        assert set(result["kinds"].values()) == {sharding_type}
        expected_type = "Tensor" if sharding_type == "data_parallel" else "ShardedTensor"
        assert set(result["types"]) == {expected_type}
    column_shards = 2 if sharding_type == "column_wise" else 1
    if sharding_type == "data_parallel":  # replicated parameters: the user's optimizer steps them
        assert results[0]["momentum"] == {}
        assert results[0]["trainable"] == [
            "data_parallel.tables.table_0.weight",
            "data_parallel.tables.table_1.weight",
        ]
    else:
        assert results[0]["momentum"] == {
            "embedding_bags.table_0.weight": [101],
            "embedding_bags.table_1.weight": [40 * column_shards],
        }
        assert results[0]["lr"] == [0.01] and results[0]["trainable"] == []
    if sharding_type == "row_wise":
        assert [r["shards"]["embedding_bags.table_0.weight"] for r in results] == [[[51, 16]], [[50, 16]]]
    if sharding_type == "column_wise":
        placed = [r["shards"]["embedding_bags.table_1.weight"] for r in results]
        assert sorted(sum(placed, [])) == [[40, 32], [40, 32]]
        assert sum((r["shards"]["embedding_bags.table_0.weight"] for r in results), []) == [[101, 16]]
