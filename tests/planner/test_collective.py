"""collective_plan across two real gloo ranks on loopback (the shared spawn harness: FileStore rendezvous,
a barrier before teardown, no interpreter finalization after it)."""

import pytest
import torch.distributed as dist

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.planner import EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology
from tests.distributed.multiprocess import run_multiprocess
from tests.planner.helpers import standard_tables

MB = 1_000_000
FITS = standard_tables(4, rows=10_000, dim=32)
TOO_BIG = {"ebc": [EmbeddingBagConfig(10_000_000, 128, name="huge")]}


def _plans(env: ShardingEnv) -> dict[str, str]:
    # Rank 1 is configured to prefer another plan: the broadcast must override it with rank 0's.
    constraints = {"t0": ParameterConstraints(sharding_types=["row_wise"])} if env.rank == 1 else None
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=1000 * MB), constraints=constraints)
    results = {}
    for name, tables in (("fits", FITS), ("too_big", TOO_BIG)):
        try:
            results[name] = planner.collective_plan(tables).to_json()
        except PlannerError as e:
            results[name] = f"error: {e}"
    return results


@pytest.mark.slow  # ~10 s: two spawned interpreters import torch and fbgemm
def test_collective_plan_on_two_gloo_ranks():
    results = run_multiprocess(_plans, 2)
    fits = [r["fits"] for r in results]
    # Every rank holds rank 0's plan, although rank 1's own constraints would give another.
    assert fits[0] == fits[1]
    assert fits[0] == EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=1000 * MB)).plan(FITS).to_json()
    # A planning error on rank 0 reaches every rank instead of leaving it waiting.
    expected = "error: planning failed on rank 0: PlannerError: cannot place table 'huge'"
    for result in results:
        assert result["too_big"].startswith(expected)


def test_collective_plan_without_process_group_just_plans():
    assert not dist.is_initialized()
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=1000 * MB))
    assert planner.collective_plan(FITS).to_json() == planner.plan(FITS).to_json()
