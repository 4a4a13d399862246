"""Which of a rank's table shards share one FBGEMM table-batched kernel (TorchRec's ``group_tables``).

A TBE runs one data type, one pooling, one optimizer (its fused parameters) and one kind of kernel, so shards
are grouped by those. Shards of different widths share a kernel, except cached shards with a prefetch
pipeline: their cache's row size is the group's widest row, so each width of them gets a kernel of its own.
Cache load factors (the fraction of a table's rows cached) do not split groups: the group's factor is the
average over its cached tables, weighted by rows. ``use_one_tbe_per_table`` in a table's fused parameters
gives it a kernel of its own (all its shards on the rank together).

The names, fields and rules are TorchRec's (``torchrec.distributed.embedding_types.ShardedEmbeddingTable``,
``GroupedEmbeddingConfig``; ``torchrec.distributed.embedding_sharding.group_tables``), so code that plans
kernel groups the TorchRec way ports; rectrain's sharded collections run the ``dense`` and ``fused`` kernels.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensorMetadata

from rectrain.embedding import layout
from rectrain.embedding.config import DataType, PoolingType
from rectrain.planner.types import EmbeddingComputeKernel

logger = logging.getLogger(__name__)

CACHE_LOAD_FACTOR_STR = "cache_load_factor"
USE_ONE_TBE_PER_TABLE = "use_one_tbe_per_table"
FUSED_PARAM_SSD_TABLE_LIST = "ssd_table_list"
# Grouping-only keys, never passed to a kernel.
_NOT_KERNEL_PARAMS = ("_batch_key", USE_ONE_TBE_PER_TABLE)

_CACHED = (EmbeddingComputeKernel.FUSED_UVM_CACHING, EmbeddingComputeKernel.QUANT_UVM_CACHING)
_KEY_VALUE = (
    EmbeddingComputeKernel.KEY_VALUE,
    EmbeddingComputeKernel.SSD_VIRTUAL_TABLE,
    EmbeddingComputeKernel.DRAM_VIRTUAL_TABLE,
    EmbeddingComputeKernel.DRAM_SSD_VIRTUAL_TABLE,
)
# Kernels that differ only in where the rows live run in one TBE.
_KERNEL_TYPE = {
    EmbeddingComputeKernel.FUSED_UVM: EmbeddingComputeKernel.FUSED,
    EmbeddingComputeKernel.FUSED_UVM_CACHING: EmbeddingComputeKernel.FUSED,
    EmbeddingComputeKernel.QUANT_UVM: EmbeddingComputeKernel.QUANT,
    EmbeddingComputeKernel.QUANT_UVM_CACHING: EmbeddingComputeKernel.QUANT,
}


@dataclass
class ShardedEmbeddingTable:
    """One shard of a table as a rank's kernel sees it: the table's config, its local size and kernel.

    ``local_rows`` / ``local_cols``: the shard's size; ``local_metadata`` / ``global_metadata``: where it sits
    in the table (torch's ``ShardMetadata`` / ``ShardedTensorMetadata``), when known. A description built by
    sharders from configs already checked, so it checks nothing itself.
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    num_embeddings_post_pruning: int | None = None
    init_fn: Any = None
    need_pos: bool = False
    input_dim: int | None = None
    total_num_buckets: int | None = None
    use_virtual_table: bool = False
    virtual_table_eviction_policy: Any = None
    enable_embedding_update: bool = False
    stash_weights: bool = False
    pooling: PoolingType = PoolingType.SUM
    is_weighted: bool = False
    has_feature_processor: bool = False
    embedding_names: list[str] = field(default_factory=list)
    compute_kernel: EmbeddingComputeKernel = EmbeddingComputeKernel.DENSE
    local_rows: int = 0
    local_cols: int = 0
    local_metadata: ShardMetadata | None = None
    global_metadata: ShardedTensorMetadata | None = None
    dtensor_metadata: Any = None
    fused_params: dict[str, Any] | None = None

    def num_features(self) -> int:
        return len(self.feature_names)


@dataclass
class GroupedEmbeddingConfig:
    """The shards one kernel runs, with what they share (TorchRec's ``GroupedEmbeddingConfig``)."""

    data_type: DataType | None
    pooling: PoolingType
    is_weighted: bool
    has_feature_processor: bool
    compute_kernel: EmbeddingComputeKernel
    embedding_tables: list[ShardedEmbeddingTable]
    fused_params: dict[str, Any] | None = None
    enable_embedding_update: bool = False

    def feature_hash_sizes(self) -> list[int]:
        return [t.num_embeddings for t in self.embedding_tables for _ in range(t.num_features())]

    def num_features(self) -> int:
        return sum(t.num_features() for t in self.embedding_tables)

    def dim_sum(self) -> int:
        return sum(t.num_features() * t.local_cols for t in self.embedding_tables)

    def table_names(self) -> list[str]:
        return [t.name for t in self.embedding_tables]

    def feature_names(self) -> list[str]:
        return [name for t in self.embedding_tables for name in t.feature_names]

    def embedding_dims(self) -> list[int]:
        return [t.local_cols for t in self.embedding_tables for _ in range(t.num_features())]

    def embedding_names(self) -> list[str]:
        return [name for t in self.embedding_tables for name in t.embedding_names]


def _get_weighted_avg_cache_load_factor(tables: list[ShardedEmbeddingTable]) -> float | None:
    """The cache load factor of a group: its cached tables' factors averaged, weighted by rows (None when
    no table of the group is cached or none names a factor)."""
    total, rows = 0.0, 0
    for table in tables:
        params = table.fused_params
        cached = table.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING
        if cached and params and CACHE_LOAD_FACTOR_STR in params:
            total += params[CACHE_LOAD_FACTOR_STR] * table.num_embeddings
            rows += table.num_embeddings
    return total / rows if rows else None


def _get_grouping_fused_params(fused_params: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """The fused parameters that must agree within a group: all but the cache load factor and the SSD table
    list; ``use_one_tbe_per_table`` becomes the table's name, so only its own shards share its group."""
    params = copy.copy(fused_params)
    if not params:
        return params
    params.pop(CACHE_LOAD_FACTOR_STR, None)
    params.pop(FUSED_PARAM_SSD_TABLE_LIST, None)
    if params.get(USE_ONE_TBE_PER_TABLE, False):
        params[USE_ONE_TBE_PER_TABLE] = name
    return params


def _get_compute_kernel_type(compute_kernel: EmbeddingComputeKernel) -> EmbeddingComputeKernel:
    """The kernel a group runs: placements of the same kernel (HBM, UVM, UVM with a cache) share one."""
    return _KERNEL_TYPE.get(compute_kernel, compute_kernel)


def _prefetch_and_cached(table: ShardedEmbeddingTable) -> bool:
    """Whether the table's rows are fetched into a cache ahead of use (key-value kernels always; cached UVM
    kernels with ``prefetch_pipeline``): such tables are grouped by row width."""
    if table.compute_kernel in _KEY_VALUE:
        return True
    params = table.fused_params
    return table.compute_kernel in _CACHED and params is not None and bool(params.get("prefetch_pipeline"))


def _all_tables_are_quant_kernel(tables: list[ShardedEmbeddingTable]) -> bool:
    return all(t.compute_kernel == EmbeddingComputeKernel.QUANT for t in tables)


def _row_bytes(table: ShardedEmbeddingTable) -> int:
    return table.local_cols * table.data_type.bits // 8


def _group_key(table: ShardedEmbeddingTable, inference: bool) -> tuple:
    params = _get_grouping_fused_params(table.fused_params, table.name) or {}
    cached = _prefetch_and_cached(table)
    return (
        # Quantized (inference) kernels take rows of any data type; training kernels one each.
        None if inference else table.data_type,
        table.pooling,
        table.has_feature_processor,
        tuple(sorted(params.items())),
        _get_compute_kernel_type(table.compute_kernel),
        _row_bytes(table) if cached else 0,
        cached,
        table.use_virtual_table if inference else None,
        table.enable_embedding_update,
        table.stash_weights,
    )


def _group_rank(tables: list[ShardedEmbeddingTable]) -> list[GroupedEmbeddingConfig]:
    inference = _all_tables_are_quant_kernel(tables)
    configs = []
    for indices in layout.group_tables(tables, key=lambda t: _group_key(t, inference)):  # first-seen order
        members = [tables[i] for i in indices]
        key = _group_key(members[0], inference)
        data_type, pooling, has_processor, params, kernel = key[:5]
        kernel_params = {k: v for k, v in params if k not in _NOT_KERNEL_PARAMS}
        cache_load_factor = _get_weighted_avg_cache_load_factor(members)
        if cache_load_factor is not None:
            kernel_params[CACHE_LOAD_FACTOR_STR] = cache_load_factor
        configs.append(
            GroupedEmbeddingConfig(
                data_type=data_type,
                pooling=pooling,
                is_weighted=members[0].is_weighted,
                has_feature_processor=has_processor,
                compute_kernel=kernel,
                embedding_tables=members,
                fused_params=kernel_params,
                enable_embedding_update=key[8],
            )
        )
    return configs


def group_tables(tables_per_rank: list[list[ShardedEmbeddingTable]]) -> list[list[GroupedEmbeddingConfig]]:
    """Per rank, the kernel groups of its shards, in the order each group's first shard appears.

    Every table must be weighted, or none (a collection's inputs carry weights for all features or none).
    """
    weighted = {t.is_weighted for tables in tables_per_rank for t in tables}
    if len(weighted) > 1:
        raise ValueError("group_tables: tables must be all weighted or all unweighted")
    grouped = [_group_rank(tables) for tables in tables_per_rank]
    for rank, groups in enumerate(grouped):
        for group in groups:
            logger.debug("rank %d kernel %s: %s", rank, group.compute_kernel.value, group.table_names())
    return grouped
