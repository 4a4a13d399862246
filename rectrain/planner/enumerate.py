"""Enumerate every legal way to shard each table (shapes only; ranks are chosen by the partitioner).

Shapes follow FBGEMM/TorchRec semantics:
- data parallel: one full shard replicated on every rank (dense kernel only: its gradient is all-reduced);
- table wise: one full shard on one rank;
- row wise: ``world_size`` row blocks of ``ceil(num_embeddings / world_size)`` rows (block-bucketize), shard
  ``i`` on rank ``i``; the last shards are smaller, possibly empty;
- column wise: column blocks of a width that is a multiple of 4, each placed like a table-wise table; a
  table too narrow to split is one column shard (TorchRec does the same);
- table row wise: row blocks over the ``local_world_size`` ranks of one host, the host chosen by the
  partitioner; on a single host that is row-wise within it (as in TorchRec).
"""

from __future__ import annotations

import dataclasses
import logging
import math

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.errors import ConfigError
from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.topology import Topology
from rectrain.planner.types import (
    PLANNED_SHARDING_TYPES,
    RUNNABLE_KERNELS,
    EmbeddingComputeKernel,
    Shard,
    ShardingType,
)

logger = logging.getLogger(__name__)

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


class EmbeddingEnumerator:
    """Lists the legal :class:`ShardingOption` of every table, in a deterministic order."""

    def __init__(self, topology: Topology, batch_size: int) -> None:
        self._topology = topology
        self._batch_size = batch_size

    def enumerate(
        self,
        tables: dict[str, list[BaseEmbeddingConfig]],
        constraints: dict[str, ParameterConstraints],
        offered: list[ShardingType] | None = None,
    ) -> list[list[ShardingOption]]:
        """Options per table, tables ordered by (module path, table name); ``offered`` (the sharders' types)
        narrows every table's allowed sharding types."""
        result = []
        for module_path in sorted(tables):
            for table in sorted(tables[module_path], key=lambda t: t.name):
                constraint = _narrowed(
                    constraints.get(table.name, ParameterConstraints()).validate(), offered
                )
                options = self._table_options(module_path, table, constraint)
                if not options:
                    raise ConfigError(
                        f"table {table.name!r} (module {module_path!r}): no sharding is legal with "
                        f"sharding_types={_names(constraint.sharding_types)} and "
                        f"compute_kernels={_names(constraint.compute_kernels)}: "
                        + "; ".join(self._refusals(table, constraint))
                    )
                result.append(options)
        return result

    def _table_options(
        self, module_path: str, table: BaseEmbeddingConfig, constraint: ParameterConstraints
    ) -> list[ShardingOption]:
        features = constraint.per_feature(table, self._batch_size)
        allowed_types = constraint.sharding_types or list(PLANNED_SHARDING_TYPES)
        allowed_kernels = constraint.compute_kernels or list(RUNNABLE_KERNELS)
        options = []
        for sharding_type in PLANNED_SHARDING_TYPES:
            if sharding_type not in allowed_types:
                continue
            for shards in self._shapes(table, sharding_type, constraint):
                for kernel in RUNNABLE_KERNELS:
                    if kernel in allowed_kernels and _kernel_fits(sharding_type, kernel):
                        options.append(
                            ShardingOption.for_table(
                                module_path, table, sharding_type, kernel, shards, features
                            )
                        )
        return options

    def _refusals(self, table: BaseEmbeddingConfig, constraint: ParameterConstraints) -> list[str]:
        """Why each allowed sharding type has no option (the reasons TorchRec's enumerator has too)."""
        reasons = []
        allowed_kernels = constraint.compute_kernels or list(RUNNABLE_KERNELS)
        reasons += [k.unsupported_reason for k in allowed_kernels if k.unsupported_reason]
        for kind in constraint.sharding_types or list(PLANNED_SHARDING_TYPES):
            if kind.unsupported_reason:
                reasons.append(kind.unsupported_reason)
            elif not self._shapes(table, kind, constraint):
                parts = self._topology.world_size if kind == ShardingType.ROW_WISE else None
                parts = parts or self._topology.local_world_size
                reasons.append(
                    f"{kind.value} shards would have {math.ceil(table.num_embeddings / parts)} rows, fewer "
                    f"than min_partition={constraint.min_partition}"
                )
            elif not any(_kernel_fits(kind, k) for k in allowed_kernels):
                kernel = "dense" if kind == ShardingType.DATA_PARALLEL else "fused"
                reasons.append(
                    f"{kind.value} runs only the {kernel} kernel (as in TorchRec: replicas all-reduce their "
                    "gradients, routed shards update in backward)"
                )
        return reasons

    def _shapes(
        self, table: BaseEmbeddingConfig, sharding_type: ShardingType, constraint: ParameterConstraints
    ) -> list[list[Shard]]:
        rows, cols = table.num_embeddings, table.embedding_dim
        topo = self._topology
        min_part = constraint.min_partition or 1
        if sharding_type in (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE):
            return [[Shard(0, rows, 0, cols)]]
        if sharding_type == ShardingType.ROW_WISE:
            if math.ceil(rows / topo.world_size) < min_part:
                return []
            return [
                [Shard(o, n, 0, cols, rank=i) for i, (o, n) in enumerate(row_blocks(rows, topo.world_size))]
            ]
        if sharding_type == ShardingType.TABLE_ROW_WISE:
            # On one host (local_world_size == world_size) this is row-wise within the host, as in TorchRec;
            # offered only when asked for, since unasked it would duplicate the row-wise option.
            if topo.num_hosts == 1 and ShardingType.TABLE_ROW_WISE not in (constraint.sharding_types or []):
                return []
            if math.ceil(rows / topo.local_world_size) < min_part:
                return []
            return [[Shard(o, n, 0, cols) for o, n in row_blocks(rows, topo.local_world_size)]]
        assert sharding_type == ShardingType.COLUMN_WISE
        return [
            [Shard(0, rows, o, n) for o, n in column_blocks(cols, width)]
            for width in self._column_widths(cols, constraint)
        ]

    def _column_widths(self, cols: int, constraint: ParameterConstraints) -> list[int]:
        """Column-wise shard widths to try; ``[cols]`` (one column shard, as TorchRec places a table narrower
        than its minimum shard dim) when the table cannot be split further."""
        width = constraint.column_wise_shard_dim
        min_part = constraint.min_partition or (4 if width is not None else CW_SHARD_DIMS[0])
        if width is not None:
            # An explicit width may give more shards than ranks; several shards then share a rank.
            return [width] if min_part <= width < cols else [cols]
        even_split = 4 * math.ceil(cols / self._topology.world_size / 4)
        candidates = {*CW_SHARD_DIMS, even_split}
        widths = sorted(
            w for w in candidates if min_part <= w < cols and math.ceil(cols / w) <= self._topology.world_size
        )
        return widths or [cols]


def _narrowed(constraint: ParameterConstraints, offered: list[ShardingType] | None) -> ParameterConstraints:
    if offered is None:
        return constraint
    allowed = [t for t in constraint.sharding_types or list(PLANNED_SHARDING_TYPES) if t in offered]
    if not allowed:
        raise ConfigError(
            f"no sharding type is both allowed by the constraints ({_names(constraint.sharding_types)}) and "
            f"offered by the sharders ({_names(offered)})"
        )
    return dataclasses.replace(constraint, sharding_types=allowed)


def _kernel_fits(sharding_type: ShardingType, kernel: EmbeddingComputeKernel) -> bool:
    # A replicated table needs its gradient materialised for the all-reduce, so only the dense kernel; a
    # routed shard is updated in backward by the fused kernel (TorchRec's sharders offer the same pairs, so
    # compute_kernels=["dense"] makes a table data-parallel, as in TorchRec).
    if kernel not in RUNNABLE_KERNELS:
        return False
    return (sharding_type == ShardingType.DATA_PARALLEL) == (kernel == EmbeddingComputeKernel.DENSE)


def _names(values: list | None) -> str:
    return "all" if values is None else "[" + ", ".join(str(v) for v in values) + "]"
