"""``torch.distributed.checkpoint`` on ``dmp.state_dict()`` and the fused optimizer's ``state_dict()``: save
at 2 ranks (after a training step), load at 1 and 3 ranks into other sharding types: same outputs, same
optimizer state.

One collection holds a table of every sharding type; each load rotates the types, so every type is both saved
and loaded, into a different type and world size. Row counts leave uneven (and at 3 ranks empty) row shards.
The files read back are the ones this test just wrote, through torch's own DCP API.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.distributed.model_parallel import DistributedModelParallel
from rectrain.distributed.planner import EmbeddingShardingPlanner, Topology
from rectrain.distributed.planner.types import ParameterConstraints
from rectrain.embedding.config import FusedOptimizerConfig
from tests.distributed.multiprocess import run_multiprocess

TYPES = ["data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise"]
SHAPES = [(7, 16), (4, 8), (5, 64), (25, 64), (11, 32)]
BATCH = 3


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (rows, dim) in enumerate(SHAPES)
    ]


def _batch(example: int) -> KeyedJaggedTensor:
    """``BATCH`` examples starting at ``example`` of one fixed global batch."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(0, 4, (len(SHAPES), 6 * BATCH), generator=gen)
    ids = [torch.randint(0, rows, (int(n),), generator=gen) for (rows, _), n in zip(SHAPES, lengths.sum(1))]
    starts = lengths[:, :example].sum(1).tolist()
    ends = lengths[:, : example + BATCH].sum(1).tolist()
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(SHAPES))],
        values=torch.cat([v[s:e] for v, s, e in zip(ids, starts, ends)]),
        lengths=lengths[:, example : example + BATCH].reshape(-1),
    )


def _dmp(env, shift: int, seed: int) -> DistributedModelParallel:
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(
        _tables(), device=torch.device("cpu"), fused_optimizer=FusedOptimizerConfig("adagrad", lr=0.1)
    )
    constraints = {
        t.name: ParameterConstraints(sharding_types=[TYPES[(i + shift) % len(TYPES)]])
        for i, t in enumerate(_tables())
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=env.world_size, compute_device="cpu"), constraints=constraints
    )
    return DistributedModelParallel(
        ebc, device=torch.device("cpu"), plan=planner.collective_plan(ebc, None, env.pg)
    )


def _outputs(dmp: DistributedModelParallel, env) -> list[torch.Tensor]:
    """This rank's outputs over all 6 * BATCH examples, BATCH at a time (every rank runs every step)."""
    return [dmp(_batch(example)).values() for example in range(0, 6 * BATCH, BATCH)]


def _full(value: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor:
    """The whole tensor behind a state-dict value: a plain tensor as is, a ShardedTensor's local shards joined
    by an all-reduce (None: this rank holds no shard, as TorchRec leaves such a table out of its state)."""
    if isinstance(value, torch.Tensor) and not isinstance(value, ShardedTensor):
        return value.detach().clone()
    full = torch.zeros(shape)
    for shard in value.local_shards() if value is not None else []:
        (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
        full[row : row + rows, col : col + cols] = shard.tensor
    dist.all_reduce(full)
    return full


def _states(dmp: DistributedModelParallel) -> dict:
    """``{table: Adagrad sum}`` of the fused optimizer, read under TorchRec's keys."""
    state = dmp.fused_optimizer.state_dict()["state"]
    return {
        f"t{i}": _full(state.get(f"embedding_bags.t{i}.weight", {}).get(f"t{i}.momentum1"), shape)
        for i, shape in enumerate(SHAPES)
    }


def _save(env, path: str) -> dict:
    dmp = _dmp(env, shift=0, seed=0)
    dmp(_batch(env.rank * BATCH)).values().sum().backward()  # moves the weights and the Adagrad state
    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
    kinds = {k: type(v).__name__ for k, v in state["model"].items()}
    dcp.save(state, checkpoint_id=path)
    return {"outputs": _outputs(dmp, env), "kinds": kinds, "momentum": _states(dmp)}


def _load(env, path: str, shift: int) -> dict:
    dmp = _dmp(env, shift=shift, seed=1)  # other weights than the saved ones
    before = _outputs(dmp, env)
    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=path)
    dmp.load_state_dict(state["model"])
    dmp.fused_optimizer.load_state_dict(state["optim"])
    sharding = {n: p.sharding_type.value for n, p in dmp.plan.get_plan_for_module("").items()}
    # As TorchRec: a row block with no rows (4 rows over 3 ranks) is one empty local shard on its rank; a
    # table-wise table held elsewhere has no local shard.
    shards = {
        k: [s.tensor.numel() for s in v.local_shards()]
        for k, v in state["model"].items()
        if isinstance(v, ShardedTensor)
    }
    empty = ([0] in shards.values(), [] in shards.values())
    return {
        "before": before,
        "outputs": _outputs(dmp, env),
        "sharding": sharding,
        "empty_shard": empty,
        "momentum": _states(dmp),
    }


@pytest.mark.slow
def test_dcp_saves_at_two_ranks_and_loads_at_one_and_three_into_other_sharding_types(tmp_path):
    path = str(tmp_path / "dcp")
    saved = run_multiprocess(_save, 2, path)
    assert sorted(set(saved[0]["kinds"].values())) == ["ShardedTensor", "Tensor"]
    expected = saved[0]["outputs"]
    for world, shift in [(1, 2), (3, 1)]:
        loaded = run_multiprocess(_load, world, path, shift)
        for result in loaded:
            assert result["sharding"] == {f"t{i}": TYPES[(i + shift) % len(TYPES)] for i in range(len(TYPES))}
            assert not all(torch.equal(a, b) for a, b in zip(result["before"], expected))
            for got, want in zip(result["outputs"], expected):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
            for table, momentum in saved[0]["momentum"].items():
                assert momentum.abs().sum() > 0
                torch.testing.assert_close(result["momentum"][table], momentum, atol=0, rtol=0)
        if world == 3:
            assert any(r["empty_shard"][0] for r in loaded) and any(r["empty_shard"][1] for r in loaded)


def _adam(env, path: str, save: bool) -> dict:
    """Adam's per-element moments and per-shard step under TorchRec's keys, through DCP at one geometry."""
    torch.manual_seed(0 if save else 1)
    ebc = EmbeddingBagCollection(
        _tables()[2:4], device=torch.device("cpu"), fused_optimizer=FusedOptimizerConfig("adam", lr=0.1)
    )
    constraints = {"t2": ParameterConstraints(sharding_types=["column_wise"]), "t3": ParameterConstraints()}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=env.world_size, compute_device="cpu"), constraints=constraints
    )
    dmp = DistributedModelParallel(
        ebc, device=torch.device("cpu"), plan=planner.collective_plan(ebc, None, env.pg)
    )
    if save:
        dmp(_batch(env.rank * BATCH)).values().sum().backward()
    state = dmp.fused_optimizer.state_dict()
    if save:
        dcp.save(state, checkpoint_id=path)
    else:
        dcp.load(state, checkpoint_id=path)
        dmp.fused_optimizer.load_state_dict(state)
    own = dmp.fused_optimizer.state_dict()["state"]["embedding_bags.t2.weight"]
    return {
        "step": [list(own["t2.step"].size()), [s.tensor.tolist() for s in own["t2.step"].local_shards()]],
        "exp_avg": [s.tensor.clone() for s in own["t2.exp_avg"].local_shards() if s.tensor.numel()],
    }


def test_adam_state_saves_and_loads_through_dcp(tmp_path):
    path = str(tmp_path / "adam")
    saved = run_multiprocess(_adam, 2, path, True)
    loaded = run_multiprocess(_adam, 2, path, False)
    steps = [value for r in saved for value in r["step"][1] if value]
    assert steps == [[1.0], [1.0]]  # one step counter per column shard, each at one step
    assert sum(len(r["exp_avg"]) for r in saved) == 2
    for before, after in zip(saved, loaded):
        assert after["step"] == before["step"] and before["step"][0] == [2]
        for a, b in zip(before["exp_avg"], after["exp_avg"], strict=True):
            assert a.abs().sum() > 0 and torch.equal(a, b)
