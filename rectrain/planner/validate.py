"""Check that one table's sharding is well formed: every row and column covered once, ranks in range.

Used on plans loaded from JSON or edited by hand, so every message names the table and the bad field.
"""

from __future__ import annotations

from rectrain.errors import ConfigError
from rectrain.planner.shard_shapes import row_blocks
from rectrain.planner.types import ParameterSharding, Shard, ShardingType


def validate_sharding(
    where: str, sharding: ParameterSharding, shape: tuple[int, int], world_size: int, local_world_size: int
) -> None:
    """Raise :class:`ConfigError` naming ``where`` (``module.table``) and the field if the sharding is bad."""
    shards = sharding.sharding_spec
    if not shards:
        raise ConfigError(f"plan {where}: shards is empty; a table needs at least one shard")
    for i, shard in enumerate(shards):
        _check_bounds(where, i, shard, shape)
    _check_cover(where, shards, shape)
    _check_ranks(where, sharding, world_size)
    _check_shape_of_type(where, sharding, shape, world_size, local_world_size)


def _check_bounds(where: str, i: int, shard: Shard, shape: tuple[int, int]) -> None:
    rows, cols = shape
    for name in ("row_offset", "num_rows", "col_offset", "num_cols"):
        value = getattr(shard, name)
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"plan {where}: shards[{i}].{name} must be a non-negative int, got {value!r}")
    if shard.row_offset + shard.num_rows > rows:
        raise ConfigError(
            f"plan {where}: shards[{i}] rows {shard.row_offset}..{shard.row_offset + shard.num_rows} "
            f"exceed num_embeddings {rows}"
        )
    if shard.col_offset + shard.num_cols > cols:
        raise ConfigError(
            f"plan {where}: shards[{i}] cols {shard.col_offset}..{shard.col_offset + shard.num_cols} "
            f"exceed embedding_dim {cols}"
        )


def _check_cover(where: str, shards: list[Shard], shape: tuple[int, int]) -> None:
    for i, a in enumerate(shards):
        for j in range(i + 1, len(shards)):
            b = shards[j]
            rows_meet = max(a.row_offset, b.row_offset) < min(
                a.row_offset + a.num_rows, b.row_offset + b.num_rows
            )
            cols_meet = max(a.col_offset, b.col_offset) < min(
                a.col_offset + a.num_cols, b.col_offset + b.num_cols
            )
            if rows_meet and cols_meet:
                raise ConfigError(f"plan {where}: shards[{i}] and shards[{j}] overlap")
    covered = sum(s.num_rows * s.num_cols for s in shards)
    if covered != shape[0] * shape[1]:
        raise ConfigError(
            f"plan {where}: shards cover {covered} of the table's {shape[0]} x {shape[1]} = "
            f"{shape[0] * shape[1]} cells; every row and column must be in exactly one shard"
        )


def _check_ranks(where: str, sharding: ParameterSharding, world_size: int) -> None:
    shards = sharding.sharding_spec
    if sharding.sharding_type == ShardingType.DATA_PARALLEL:
        if len(shards) != 1 or shards[0].rank is not None:
            raise ConfigError(
                f"plan {where}: data_parallel takes one shard with rank null (it is replicated)"
            )
        if sharding.ranks != list(range(world_size)):
            raise ConfigError(f"plan {where}: data_parallel ranks must be every rank 0..{world_size - 1}")
        return
    for i, shard in enumerate(shards):
        if not isinstance(shard.rank, int) or not 0 <= shard.rank < world_size:
            raise ConfigError(
                f"plan {where}: shards[{i}].rank is {shard.rank!r} but world_size is {world_size}"
            )
    shard_ranks = [s.rank for s in shards]
    if sharding.ranks != shard_ranks:
        raise ConfigError(
            f"plan {where}: ranks {sharding.ranks} do not match the shards' ranks {shard_ranks}"
        )


def _check_shape_of_type(
    where: str, sharding: ParameterSharding, shape: tuple[int, int], world_size: int, local_world_size: int
) -> None:
    shards, kind = sharding.sharding_spec, sharding.sharding_type
    if kind == ShardingType.TABLE_WISE and len(shards) != 1:
        raise ConfigError(f"plan {where}: table_wise takes exactly one shard, got {len(shards)}")
    if kind == ShardingType.COLUMN_WISE and any(s.num_cols % 4 for s in shards):
        raise ConfigError(f"plan {where}: column_wise shard widths must be multiples of 4")
    if kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        parts = world_size if kind == ShardingType.ROW_WISE else local_world_size
        got = [(s.row_offset, s.num_rows) for s in shards]
        if got != row_blocks(shape[0], parts):
            raise ConfigError(
                f"plan {where}: {kind.value} shards must be the {parts} row blocks of "
                f"ceil({shape[0]} / {parts}) rows in order (FBGEMM block bucketize); got (offset, rows) {got}"
            )
    if kind == ShardingType.ROW_WISE and [s.rank for s in shards] != list(range(world_size)):
        raise ConfigError(f"plan {where}: row_wise shard i must be on rank i")
    if kind == ShardingType.TABLE_ROW_WISE:
        hosts = {s.rank // local_world_size for s in shards}
        if len(hosts) != 1 or [s.rank % local_world_size for s in shards] != list(range(local_world_size)):
            raise ConfigError(f"plan {where}: table_row_wise shards must fill the ranks of one host in order")
