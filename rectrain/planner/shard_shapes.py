"""How a table is cut into shards: row blocks, column blocks and the blocks of each sharding type, the same
for the planner's options, TorchRec's enumerator API and hand-built plans (``distributed.parallel.plans``).
"""

from __future__ import annotations

import math

import torch

from rectrain.planner.types import ShardingType

# Column-wise widths rectrain's planner tries when the constraints name none; the first is its narrowest
# automatic shard (our tables are often 64 wide).
CW_SHARD_DIMS = (32, 64, 128, 256)
MIN_CW_DIM = 128  # TorchRec's narrowest automatic column-wise shard (``calculate_shard_sizes_and_offsets``)


def row_blocks(num_rows: int, parts: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of ``parts`` row blocks of ``ceil(num_rows / parts)`` rows (FBGEMM bucketize)."""
    block = math.ceil(num_rows / parts)
    return [(min(i * block, num_rows), max(0, min(block, num_rows - i * block))) for i in range(parts)]


def column_blocks(num_cols: int, width: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of column blocks of ``width`` columns; the last one takes the remainder."""
    return [(offset, min(width, num_cols - offset)) for offset in range(0, num_cols, width)]


def calculate_shard_sizes_and_offsets(
    tensor: torch.Tensor,
    world_size: int,
    local_world_size: int,
    sharding_type: str,
    col_wise_shard_dim: int | None = None,
    num_buckets: int | None = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """``([[rows, cols] per shard], [[row offset, col offset] per shard])`` of ``tensor`` sharded as
    ``sharding_type``, with the blocks rectrain's plans use (``row_blocks``, ``column_blocks``).

    Column-wise (and table-column-wise) shards are ``col_wise_shard_dim`` wide, rounded up to the narrowest
    multiple of 4 that divides the width (TorchRec's rule; ``MIN_CW_DIM`` when none is given; the whole
    width when nothing divides it). Row-wise shards of a bucketed table (``num_buckets``, a virtual table)
    are whole buckets: the first ``num_buckets % world_size`` ranks take one bucket more.
    """
    rows, cols = tensor.shape
    kind = str(sharding_type)
    if kind == ShardingType.DATA_PARALLEL.value:
        return [[rows, cols]] * world_size, [[0, 0]] * world_size
    if kind == ShardingType.TABLE_WISE.value:
        return [[rows, cols]], [[0, 0]]
    if kind == ShardingType.ROW_WISE.value:
        blocks = (
            _bucket_blocks(rows, world_size, num_buckets) if num_buckets else row_blocks(rows, world_size)
        )
        return [[n, cols] for _, n in blocks], [[o, 0] for o, _ in blocks]
    if kind == ShardingType.TABLE_ROW_WISE.value:
        blocks = row_blocks(rows, local_world_size)
        return [[n, cols] for _, n in blocks], [[o, 0] for o, _ in blocks]
    width = _column_shard_width(cols, col_wise_shard_dim)
    if kind in (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value):
        blocks = column_blocks(cols, width)
        return [[rows, n] for _, n in blocks], [[0, o] for o, _ in blocks]
    if kind == ShardingType.GRID_SHARD.value:
        # Row blocks within a host, repeated for every column block.
        grid = [(r, c) for c in column_blocks(cols, width) for r in row_blocks(rows, local_world_size)]
        return [[rn, cn] for (_, rn), (_, cn) in grid], [[ro, co] for (ro, _), (co, _) in grid]
    raise ValueError(f"unrecognized or unsupported sharding type {sharding_type!r}")


def _bucket_blocks(rows: int, parts: int, num_buckets: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of ``parts`` row blocks made of whole buckets of ``rows / num_buckets`` rows."""
    if num_buckets < parts:
        raise ValueError(
            f"{num_buckets} buckets cannot be split over {parts} ranks (a bucket is never split); "
            "use at least as many buckets as ranks"
        )
    if rows % num_buckets:
        raise ValueError(f"{rows} rows do not split into {num_buckets} equal buckets")
    bucket_rows = rows // num_buckets
    per_rank, extra = divmod(num_buckets, parts)
    sizes = [bucket_rows * (per_rank + (1 if rank < extra else 0)) for rank in range(parts)]
    offsets = [sum(sizes[:rank]) for rank in range(parts)]
    return list(zip(offsets, sizes))


def _column_shard_width(cols: int, shard_dim: int | None) -> int:
    lower = shard_dim or MIN_CW_DIM
    for width in range(lower, cols):
        if cols % width == 0 and width % 4 == 0:
            return width
    return cols
