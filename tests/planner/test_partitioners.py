"""TorchRec's partitioners place a proposal's shards by perf, within every device's memory."""

import pytest
import torch
from torch import nn

from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.partitioners import GreedyPerfPartitioner, MemoryBalancedPartitioner
from rectrain.planner.sharding_option import Perf, ShardingOption
from rectrain.planner.topology import Storage, Topology
from rectrain.planner.types import Shard

MB = 1024**2


def _option(name: str, sharding_type: str, shards: list[tuple[float, int]]) -> ShardingOption:
    partition_by = {"table_wise": "device", "row_wise": "uniform", "table_row_wise": "host"}[sharding_type]
    return ShardingOption(
        name, torch.empty(100, 8, device="meta"), ("ebc", nn.Module()), [1.0], 8, sharding_type, partition_by,
        "fused", [Shard(size=[100, 8], offset=[0, 0], perf=Perf(p, 0, 0, 0), storage=Storage(hbm=b, ddr=0))
                  for p, b in shards],
    )  # fmt: skip


def _ranks(plan: list[ShardingOption]) -> dict[str, list[int]]:
    return {o.name: [s.rank for s in o.shards] for o in plan}


def test_greedy_puts_uniform_shards_in_order_then_each_table_on_the_least_loaded_rank():
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=10 * MB)
    proposal = [
        _option("rw", "row_wise", [(1.0, MB), (1.0, MB)]),
        _option("big", "table_wise", [(5.0, MB)]),
        _option("small_a", "table_wise", [(2.0, MB)]),
        _option("small_b", "table_wise", [(2.0, MB)]),
    ]
    plan = GreedyPerfPartitioner().partition(proposal, topology)
    assert _ranks(plan) == {"rw": [0, 1], "big": [0], "small_a": [1], "small_b": [1]}


def test_greedy_skips_a_full_rank_and_fails_by_name_when_none_has_room():
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=3 * MB)
    plan = GreedyPerfPartitioner().partition(
        [_option("a", "table_wise", [(9.0, 2 * MB)]), _option("b", "table_wise", [(1.0, 2 * MB)])], topology
    )
    assert sorted(r for ranks in _ranks(plan).values() for r in ranks) == [0, 1]
    with pytest.raises(PlannerError, match="table c") as failure:
        GreedyPerfPartitioner().partition([_option("c", "table_wise", [(1.0, 4 * MB)])], topology)
    assert failure.value.error_type == PlannerErrorType.PARTITION


def test_table_row_wise_blocks_stay_on_one_host():
    topology = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=10 * MB)
    proposal = [
        _option("tw", "table_wise", [(5.0, 3 * MB)]),
        _option("twrw", "table_row_wise", [(1.0, MB)] * 2),
    ]
    plan = GreedyPerfPartitioner().partition(proposal, topology)
    assert _ranks(plan)["tw"] == [0] and _ranks(plan)["twrw"] == [2, 3]  # the other host is less loaded


def test_memory_balanced_evens_out_memory_within_the_perf_tolerance():
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=1000 * MB)
    proposal = [
        _option("heavy", "table_wise", [(1.0, 300 * MB)]),
        _option("light_a", "table_wise", [(1.0, 100 * MB)]),
        _option("light_b", "table_wise", [(1.0, 100 * MB)]),
        _option("light_c", "table_wise", [(1.0, 100 * MB)]),
    ]
    plan = MemoryBalancedPartitioner(tolerance=1.0).partition(proposal, topology)
    hbm = [0, 0]
    for option in plan:
        hbm[option.shards[0].rank] += option.shards[0].storage.hbm
    assert sorted(hbm) == [300 * MB, 300 * MB]
