import pytest
from hypothesis import given
from hypothesis import strategies as st

from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig
from rectrain.planner import EmbeddingComputeKernel, ParameterConstraints, ShardingType, Topology
from rectrain.planner.enumerate import EmbeddingEnumerator
from rectrain.planner.perf import estimate_perf
from rectrain.planner.storage import estimate_storage

TOPO = Topology(world_size=4, local_world_size=2, ddr_cap=10**12)
ADAGRAD = FusedOptimizerConfig(optimizer="rowwise_adagrad")


def _option(table, sharding_type, kernel=EmbeddingComputeKernel.FUSED, pooling=1.0, batch=64, world=TOPO):
    constraint = ParameterConstraints(
        sharding_types=[sharding_type],
        compute_kernels=[kernel],
        pooling_factors=[pooling],
        column_wise_shard_dim=32,
    )
    (options,) = EmbeddingEnumerator(world, batch).enumerate_tables({"m": [table]}, {table.name: constraint})
    return options[0]


def test_table_wise_storage_counts_weights_state_and_buffers():
    option = _option(EmbeddingBagConfig(1000, 64, name="t"), ShardingType.TABLE_WISE, pooling=2.0, batch=64)
    (nbytes,) = estimate_storage(option, TOPO, ADAGRAD)
    weights = 1000 * 64 * 4
    state = 1000 * 1 * 4  # rowwise adagrad: one fp32 per row
    ids = 64 * 4 * 2.0 * 8  # global batch (64 per rank x 4 ranks) x pooling factor x int64
    outputs = 64 * 4 * 64 * 4  # one pooled fp32 vector per example of the global batch
    assert nbytes == weights + state + ids + outputs


def test_adam_state_is_counted():
    table = EmbeddingBagConfig(1000, 64, name="t")
    fused = _option(table, ShardingType.TABLE_WISE)
    adam = FusedOptimizerConfig(optimizer="adam")
    sgd = FusedOptimizerConfig(optimizer="sgd")
    assert estimate_storage(fused, TOPO, adam)[0] - estimate_storage(fused, TOPO, sgd)[0] == 1000 * 128 * 4


def test_data_parallel_replicates_the_table_and_pays_an_all_reduce():
    table = EmbeddingBagConfig(10_000, 64, name="t")
    dp = _option(table, ShardingType.DATA_PARALLEL, kernel=EmbeddingComputeKernel.DENSE)
    (nbytes,) = estimate_storage(dp, TOPO, ADAGRAD)
    assert nbytes > 10_000 * 64 * 4
    single = Topology(world_size=1, ddr_cap=10**12)
    dp_single = _option(table, ShardingType.DATA_PARALLEL, kernel=EmbeddingComputeKernel.DENSE, world=single)
    all_reduce = 2 * 10_000 * 64 * 4 * 3 / 4 / TOPO.comm_bw
    assert estimate_perf(dp, TOPO, ADAGRAD)[0] == pytest.approx(
        estimate_perf(dp_single, single, ADAGRAD)[0] + all_reduce
    )


def test_row_wise_shards_split_ids_but_each_sends_full_partial_sums():
    table = EmbeddingBagConfig(1000, 64, name="t")
    tw = estimate_storage(_option(table, ShardingType.TABLE_WISE), TOPO, ADAGRAD)[0]
    rw = estimate_storage(_option(table, ShardingType.ROW_WISE), TOPO, ADAGRAD)
    assert len(rw) == 4 and all(b < tw for b in rw)


def _total_perf(table, sharding_type, kernel, pooling):
    option = _option(table, sharding_type, kernel=kernel, pooling=pooling)
    per_shard = estimate_perf(option, TOPO, ADAGRAD)
    assert all(t > 0 for t in per_shard)
    return sum(per_shard)


SHARDED = [
    ShardingType.TABLE_WISE,
    ShardingType.ROW_WISE,
    ShardingType.COLUMN_WISE,
    ShardingType.TABLE_ROW_WISE,
]
# The kernel pairs a plan can hold (as TorchRec's sharders offer them): routed shards fused, replicas dense.
CASES = [(t, EmbeddingComputeKernel.FUSED) for t in SHARDED] + [
    (ShardingType.DATA_PARALLEL, EmbeddingComputeKernel.DENSE)
]


@pytest.mark.parametrize("sharding_type, kernel", CASES)
@given(
    rows=st.integers(8, 50_000),
    extra_rows=st.integers(0, 50_000),
    dim=st.sampled_from([64, 96, 128]),
    pooling=st.floats(0.1, 50.0),
    pooled=st.booleans(),
)
def test_perf_is_monotone_in_pooling_rows_and_dims(
    sharding_type, kernel, rows, extra_rows, dim, pooling, pooled
):
    config = EmbeddingBagConfig if pooled else EmbeddingConfig

    def cost(r, d, p):
        return _total_perf(config(r, d, name="t"), sharding_type, kernel, p)

    base = cost(rows, dim, pooling)
    assert cost(rows, dim, pooling * 1.5) > base
    # Row-wise totals sum per-shard fractions, so equal costs may differ in the last bit: allow 1e-9.
    assert cost(rows + extra_rows, dim, pooling) >= base * (1 - 1e-9)
    assert cost(rows, dim + 32, pooling) > base


@given(rows=st.integers(1, 10_000), extra_rows=st.integers(1, 10_000), pooling=st.floats(0.1, 50.0))
def test_table_wise_shard_storage_is_monotone(rows, extra_rows, pooling):
    def nbytes(r, p):
        option = _option(EmbeddingBagConfig(r, 64, name="t"), ShardingType.TABLE_WISE, pooling=p)
        return estimate_storage(option, TOPO, ADAGRAD)[0]

    assert nbytes(rows + extra_rows, pooling) > nbytes(rows, pooling)
    assert nbytes(rows, pooling * 2) > nbytes(rows, pooling)


def test_enumerating_a_module_fills_perf_from_the_planners_model_in_milliseconds():
    from rectrain.distributed.parallel.sharders import EmbeddingBagCollectionSharder
    from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection

    table = EmbeddingBagConfig(1000, 64, name="t", feature_names=["f"])
    module = EmbeddingBagCollection(tables=[table], device="meta")
    enumerator = EmbeddingEnumerator(TOPO, 64)
    options = enumerator.enumerate(module, [EmbeddingBagCollectionSharder()])
    options = [o for o in options if o.sharding_type == "row_wise"]
    assert options
    for option in options:
        seconds = estimate_perf(option, TOPO, FusedOptimizerConfig())
        assert [s.perf.total for s in option.shards] == pytest.approx([1000 * t for t in seconds])
        assert all(s.perf.input_dist_comms > 0 and s.perf.fwd_comms > 0 for s in option.shards)


def test_torchrec_storage_rule_sizes_the_planners_optimizer_state():
    from rectrain.planner.shard_estimators import estimate_storage_torchrec

    option = _option(EmbeddingBagConfig(1000, 64, name="t"), ShardingType.TABLE_WISE)
    sgd_bytes, adam_bytes = (
        estimate_storage_torchrec(option, TOPO, FusedOptimizerConfig(optimizer=o))[0] for o in ("sgd", "adam")
    )
    assert adam_bytes - sgd_bytes == 2 * 1000 * 64 * 4  # Adam's two moments per weight
