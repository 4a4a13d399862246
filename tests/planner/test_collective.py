"""collective_plan across two real gloo ranks on loopback (FileStore rendezvous, no fixed port)."""

import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.planner import EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology
from tests.planner.helpers import standard_tables

MB = 1_000_000
FITS = standard_tables(4, rows=10_000, dim=32)
TOO_BIG = {"ebc": [EmbeddingBagConfig(10_000_000, 128, name="huge")]}


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        # Rank 1 is configured to prefer another plan: the broadcast must override it with rank 0's.
        constraints = {"t0": ParameterConstraints(sharding_types=["row_wise"])} if rank == 1 else None
        planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=1000 * MB), constraints=constraints)
        for name, tables in (("fits", FITS), ("too_big", TOO_BIG)):
            try:
                result = planner.collective_plan(tables).to_json()
            except PlannerError as e:
                result = f"error: {e}"
            with open(os.path.join(out_dir, f"{name}{rank}.txt"), "w") as f:
                f.write(result)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # ~10 s: two spawned interpreters import torch and fbgemm
def test_collective_plan_on_two_gloo_ranks(tmp_path):
    mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    fits = [(tmp_path / f"fits{r}.txt").read_text() for r in range(2)]
    too_big = [(tmp_path / f"too_big{r}.txt").read_text() for r in range(2)]
    # Every rank holds rank 0's plan, although rank 1's own constraints would give another.
    assert fits[0] == fits[1]
    assert fits[0] == EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=1000 * MB)).plan(FITS).to_json()
    # A planning error on rank 0 reaches every rank instead of leaving it waiting.
    for result in too_big:
        assert result.startswith("error: planning failed on rank 0: PlannerError: cannot place table 'huge'")


def test_collective_plan_without_process_group_just_plans():
    assert not dist.is_initialized()
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=1000 * MB))
    assert planner.collective_plan(FITS).to_json() == planner.plan(FITS).to_json()
