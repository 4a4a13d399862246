import pytest

from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.errors import ConfigError
from rectrain.planner import EmbeddingComputeKernel, ParameterConstraints, ShardingType, Topology
from rectrain.planner.enumerate import EmbeddingEnumerator, column_blocks, row_blocks


def _options(table, world=4, local=None, constraint=None):
    topo = Topology(world_size=world, local_world_size=local, ddr_cap=10**12)
    constraints = {table.name: constraint} if constraint else {}
    (options,) = EmbeddingEnumerator(topo, batch_size=32).enumerate_tables({"m": [table]}, constraints)
    return options


def test_row_blocks_follow_block_bucketize():
    assert row_blocks(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert row_blocks(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]
    assert column_blocks(96, 32) == [(0, 32), (32, 32), (64, 32)]


def test_every_sharding_type_on_one_host_except_twrw():
    options = _options(EmbeddingBagConfig(1000, 128, name="t"))
    kinds = {o.sharding_type for o in options}
    assert kinds == {
        ShardingType.DATA_PARALLEL,
        ShardingType.TABLE_WISE,
        ShardingType.ROW_WISE,
        ShardingType.COLUMN_WISE,
    }
    dp = [o for o in options if o.sharding_type == ShardingType.DATA_PARALLEL]
    assert [o.compute_kernel for o in dp] == [EmbeddingComputeKernel.DENSE]
    rw = next(o for o in options if o.sharding_type == ShardingType.ROW_WISE)
    assert [(s.row_offset, s.num_rows, s.rank) for s in rw.shards] == [
        (0, 250, 0),
        (250, 250, 1),
        (500, 250, 2),
        (750, 250, 3),
    ]


def test_column_wise_widths_are_multiples_of_4_and_cover_the_table():
    options = _options(EmbeddingBagConfig(1000, 200, name="t"))
    cw = [o for o in options if o.sharding_type == ShardingType.COLUMN_WISE]
    assert cw
    for option in cw:
        assert all(s.num_cols % 4 == 0 and s.num_rows == 1000 for s in option.shards)
        assert sum(s.num_cols for s in option.shards) == 200
        assert len(option.shards) <= 4


def test_column_wise_shard_dim_constraint():
    constraint = ParameterConstraints(sharding_types=["column_wise"], column_wise_shard_dim=8)
    options = _options(EmbeddingBagConfig(10, 64, name="t"), world=2, constraint=constraint)
    assert {len(o.shards) for o in options} == {8}


def test_table_row_wise_splits_rows_over_one_host():
    options = _options(EmbeddingBagConfig(1000, 16, name="t"), world=4, local=2)
    twrw = next(o for o in options if o.sharding_type == ShardingType.TABLE_ROW_WISE)
    assert [(s.row_offset, s.num_rows, s.rank) for s in twrw.shards] == [(0, 500, None), (500, 500, None)]


def test_table_row_wise_on_one_host_is_row_wise_within_it():
    constraint = ParameterConstraints(sharding_types=["table_row_wise"], compute_kernels=["fused"])
    (twrw,) = _options(EmbeddingBagConfig(1001, 16, name="t"), world=2, constraint=constraint)
    assert twrw.sharding_type == ShardingType.TABLE_ROW_WISE
    assert [(s.row_offset, s.num_rows) for s in twrw.shards] == [(0, 501), (501, 500)]


@pytest.mark.parametrize("dim, width", [(16, None), (8, None), (64, 64), (8, 32)])
def test_column_wise_on_a_table_too_narrow_to_split_is_one_column_shard(dim, width):
    constraint = ParameterConstraints(
        sharding_types=["column_wise"], compute_kernels=["fused"], column_wise_shard_dim=width
    )
    (cw,) = _options(EmbeddingBagConfig(100, dim, name="t"), world=2, constraint=constraint)
    assert [(s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in cw.shards] == [(0, 100, 0, dim)]


def test_constraints_restrict_options():
    constraint = ParameterConstraints(sharding_types=["row_wise", "table_wise"], compute_kernels=["fused"])
    options = _options(EmbeddingBagConfig(1000, 16, name="t"), constraint=constraint)
    assert [(o.sharding_type, o.compute_kernel) for o in options] == [
        (ShardingType.TABLE_WISE, EmbeddingComputeKernel.FUSED),
        (ShardingType.ROW_WISE, EmbeddingComputeKernel.FUSED),
    ]


def test_no_legal_option_is_a_clear_error():
    constraint = ParameterConstraints(sharding_types=["data_parallel"], compute_kernels=["fused"])
    with pytest.raises(
        ConfigError, match="table 't' .*no sharding is legal.*data_parallel runs only the dense"
    ):
        _options(EmbeddingBagConfig(1000, 16, name="t"), constraint=constraint)
    constraint = ParameterConstraints(sharding_types=["row_wise"], min_partition=300)
    with pytest.raises(
        ConfigError, match="row_wise shards would have 250 rows, fewer than min_partition=300"
    ):
        _options(EmbeddingBagConfig(1000, 16, name="t"), constraint=constraint)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sharding_types": ["diagonal"]}, "sharding_types: 'diagonal' is not one of"),
        ({"pooling_factors": [0.0]}, "pooling_factors must be a non-empty list of values > 0"),
        ({"column_wise_shard_dim": 6}, "column_wise_shard_dim must be a positive multiple of 4, got 6"),
        ({"min_partition": 0}, "min_partition must be a positive int, got 0"),
    ],
)
def test_constraint_validation(kwargs, message):
    constraint = ParameterConstraints(**kwargs)  # permissive inside, as TorchRec's; checked where planned
    with pytest.raises(ConfigError, match=message):
        constraint.validate()
    table = EmbeddingBagConfig(1000, 64, name="t", feature_names=["f"])
    with pytest.raises(ConfigError, match=message):
        EmbeddingEnumerator(Topology(world_size=2, ddr_cap=1 << 30), 16).enumerate_tables(
            {"m": [table]}, {"t": constraint}
        )


def test_per_feature_values_broadcast_or_must_match():
    table = EmbeddingBagConfig(10, 8, name="t", feature_names=["a", "b"])
    assert ParameterConstraints(pooling_factors=[3.0]).per_feature(table, 16) == [(16, 3.0), (16, 3.0)]
    with pytest.raises(ConfigError, match="pooling_factors has 3 values but the table has 2 features"):
        ParameterConstraints(pooling_factors=[1.0, 2.0, 3.0]).per_feature(table, 16)
