"""``torch.distributed.checkpoint`` on ``dmp.state_dict()``: save at 2 ranks, load at 1 and 3 ranks into other
sharding types, same outputs.

One collection holds a table of every sharding type; each load rotates the types, so every type is both saved
and loaded, into a different type and world size. Row counts leave uneven (and at 3 ranks empty) row shards.
The files read back are the ones this test just wrote, through torch's own DCP API.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.distributed import DistributedModelParallel
from rectrain.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
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
    ebc = EmbeddingBagCollection(_tables(), device=torch.device("cpu"))
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


def _save(env, path: str) -> dict:
    dmp = _dmp(env, shift=0, seed=0)
    state = dmp.state_dict()
    kinds = {k: type(v).__name__ for k, v in state.items()}
    dcp.save(state, checkpoint_id=path)
    return {"outputs": _outputs(dmp, env), "kinds": kinds}


def _load(env, path: str, shift: int) -> dict:
    dmp = _dmp(env, shift=shift, seed=1)  # other weights than the saved ones
    before = _outputs(dmp, env)
    state = dmp.state_dict()
    dcp.load(state, checkpoint_id=path)
    dmp.load_state_dict(state)
    sharding = {n: p.sharding_type.value for n, p in dmp.plan.get_plan_for_module("").items()}
    # A row block with no rows (4 rows over 3 ranks) is in no rank's local shards.
    empty = any(isinstance(v, ShardedTensor) and not v.local_shards() for v in state.values())
    return {"before": before, "outputs": _outputs(dmp, env), "sharding": sharding, "empty_shard": empty}


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
        if world == 3:
            assert any(r["empty_shard"] for r in loaded)
