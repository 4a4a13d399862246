from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.planner import EmbeddingComputeKernel, Shard, ShardingType, Topology
from rectrain.planner.partition import PartitionFailure, Placement, partition
from rectrain.planner.sharding_option import ShardingOption


def _tw(name: str, storage: int, perf: float) -> ShardingOption:
    table = EmbeddingBagConfig(100, 8, name=name)
    shard = Shard(0, 100, 0, 8, storage=storage, perf=perf)
    return ShardingOption.for_table(
        "m", table, ShardingType.TABLE_WISE, EmbeddingComputeKernel.FUSED, [shard], [(1, 1.0)]
    )


def _ranks(placement: Placement) -> dict[str, int]:
    return {o.name: o.shards[0].rank for o in placement.options}


def test_perf_greedy_puts_heaviest_first_on_least_loaded_rank():
    options = [_tw("a", 10, 1.0), _tw("b", 10, 1.0), _tw("c", 10, 2.0)]
    placement = partition(options, Topology(world_size=2, ddr_cap=100), "perf")
    assert _ranks(placement) == {"c": 0, "a": 1, "b": 1}
    assert placement.rank_perf == [2.0, 2.0]
    assert placement.score == (2.0, 20)


def test_memory_balance_evens_bytes():
    options = [_tw("a", 10, 5.0), _tw("b", 10, 5.0), _tw("c", 20, 0.1)]
    placement = partition(options, Topology(world_size=2, ddr_cap=100), "memory")
    assert placement.rank_storage == [20, 20]


def test_ties_break_by_table_name_then_lowest_rank():
    options = [_tw(name, 10, 1.0) for name in ("d", "b", "a", "c")]
    placement = partition(options, Topology(world_size=2, ddr_cap=100), "perf")
    assert _ranks(placement) == {"a": 0, "b": 1, "c": 0, "d": 1}


def test_full_ranks_are_skipped_and_failure_reports_free_memory():
    options = [_tw("a", 60, 1.0), _tw("b", 60, 0.5), _tw("c", 60, 0.1)]
    topo = Topology(world_size=2, ddr_cap=100)
    result = partition(options, topo, "perf")
    assert isinstance(result, PartitionFailure)
    assert result.option.name == "c" and result.needed == 60 and result.free == [40, 40]
    fits = partition(options[:2], topo, "perf")
    assert sorted(_ranks(fits).values()) == [0, 1]


def test_row_wise_and_data_parallel_are_fixed():
    table = EmbeddingBagConfig(100, 8, name="rw")
    rw_shards = [
        Shard(0, 50, 0, 8, rank=0, storage=5, perf=1.0),
        Shard(50, 50, 0, 8, rank=1, storage=5, perf=1.0),
    ]
    rw = ShardingOption.for_table(
        "m", table, ShardingType.ROW_WISE, EmbeddingComputeKernel.FUSED, rw_shards, [(1, 1.0)]
    )
    dp = _tw("dp", 7, 0.5)
    dp.sharding_type, dp.compute_kernel = ShardingType.DATA_PARALLEL, EmbeddingComputeKernel.DENSE
    placement = partition([rw, dp], Topology(world_size=2, ddr_cap=100), "perf")
    assert placement.rank_storage == [12, 12]
    assert [s.rank for s in placement.options[0].shards] == [0, 1]
    assert placement.options[1].shards[0].rank is None
