"""Per-table planning constraints (``torchrec.distributed.planner.ParameterConstraints``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.errors import ConfigError
from rectrain.planner.context_hash import hash_sha256_to_int
from rectrain.planner.types import EmbeddingComputeKernel, ShardingType

POOLING_FACTOR = 1.0  # expected ids per example per feature when the user gives none (TorchRec's default)


@dataclass
class KeyValueParams:
    """TorchRec's options of SSD / parameter-server key-value tables: carried by constraints and options;
    rectrain runs no key-value kernel (a plan that uses one is refused)."""

    ssd_storage_directory: str | None = None
    ssd_rocksdb_write_buffer_size: int | None = None
    ssd_rocksdb_shards: int | None = None
    gather_ssd_cache_stats: bool | None = None
    stats_reporter_config: Any = None
    use_passed_in_path: bool = True
    l2_cache_size: int | None = None  # GiB
    max_l1_cache_size: int | None = None  # MiB
    enable_async_update: bool | None = None
    bulk_init_chunk_size: int | None = None
    lazy_bulk_init_enabled: bool | None = None
    enable_raw_embedding_streaming: bool | None = None
    res_store_shards: int | None = None
    kvzch_tbe_config: Any = None
    load_ckpt_without_opt: bool = False
    ps_hosts: tuple | None = None
    ps_client_thread_num: int | None = None
    ps_max_key_per_request: int | None = None
    ps_max_local_index_length: int | None = None

    def __hash__(self) -> int:
        # str(): some fields (stats_reporter_config, kvzch_tbe_config) may hold unhashable objects
        return hash(tuple(str(v) for v in vars(self).values()))


@dataclass
class ParameterConstraints:
    """What the planner may do with one table and what it should expect of the table's inputs.

    - ``sharding_types`` / ``compute_kernels``: the allowed choices (None: all).
    - ``pooling_factors``: expected ids per example, one per feature of the table, or one for all features.
    - ``batch_sizes``: per-rank batch size per feature (or one for all); None uses the planner's batch size.
    - ``min_partition``: the fewest rows (row-wise) or columns (column-wise) a shard may have.
    - ``column_wise_shard_dim``: the width of column-wise shards (a multiple of 4); None lets the planner try
      several widths.
    - ``enforce_hbm`` / ``cacheable``: offload preferences, recorded; no kernel uses them yet.

    TorchRec's other fields are accepted so its constraints port; TorchRec's enumerator API
    (``rectrain.distributed.planner.enumerators``) reads them as TorchRec does, rectrain's planner does
    not: ``num_poolings`` (poolings per example per feature, for its storage estimate), ``device_group`` (a
    table constrained to another device type is left out), ``use_virtual_table``, ``is_weighted``,
    ``feature_names``, ``output_dtype`` and the FBGEMM kernel options ``cache_params``,
    ``stochastic_rounding``, ``bounds_check_mode``, ``key_value_params`` (carried on the enumerated
    options; rectrain's kernels take none of them).

    Construction checks nothing (TorchRec code builds placeholders); :meth:`validate`, which the planner
    calls on the constraints it plans with, checks and normalises them.
    """

    sharding_types: list[str] | None = None
    compute_kernels: list[str] | None = None
    min_partition: int | None = None
    pooling_factors: list[float] = field(default_factory=lambda: [POOLING_FACTOR])
    batch_sizes: list[int] | None = None
    column_wise_shard_dim: int | None = None
    enforce_hbm: bool | None = None
    cacheable: bool | None = None
    num_poolings: list[float] | None = None
    is_weighted: bool = False
    cache_params: Any = None
    stochastic_rounding: bool | None = None
    bounds_check_mode: Any = None
    feature_names: list[str] | None = None
    output_dtype: Any = None
    device_group: str | None = None
    key_value_params: Any = None
    use_virtual_table: bool = False

    def __hash__(self) -> int:
        """Stable across processes (TorchRec's), for a planner context's hash."""
        lists = [self.sharding_types, self.compute_kernels, self.pooling_factors, self.num_poolings]
        lists += [self.batch_sizes, self.feature_names]
        fields = [self.min_partition, self.is_weighted, self.cache_params, self.enforce_hbm]
        fields += [self.stochastic_rounding, self.bounds_check_mode, self.output_dtype, self.device_group]
        fields += [self.key_value_params, self.use_virtual_table, self.column_wise_shard_dim, self.cacheable]
        return hash_sha256_to_int([tuple(v) if v else None for v in lists] + fields)

    def validate(self) -> ParameterConstraints:
        """Checks the constraints (a clear error naming the field) and parses names to enums; returns self."""
        if self.sharding_types is not None:
            self.sharding_types = [_parse(ShardingType, s, "sharding_types") for s in self.sharding_types]
            if not self.sharding_types:
                raise ConfigError("sharding_types must not be empty (use None to allow every type)")
        if self.compute_kernels is not None:
            self.compute_kernels = [
                _parse(EmbeddingComputeKernel, k, "compute_kernels") for k in self.compute_kernels
            ]
            if not self.compute_kernels:
                raise ConfigError("compute_kernels must not be empty (use None to allow every kernel)")
        self.pooling_factors = [float(p) for p in self.pooling_factors]
        if not self.pooling_factors or any(not p > 0 for p in self.pooling_factors):
            raise ConfigError(
                f"pooling_factors must be a non-empty list of values > 0, got {self.pooling_factors}"
            )
        if self.batch_sizes is not None and (
            not self.batch_sizes or any(not isinstance(b, int) or b <= 0 for b in self.batch_sizes)
        ):
            raise ConfigError(
                f"batch_sizes must be a non-empty list of positive ints, got {self.batch_sizes}"
            )
        if self.min_partition is not None and (
            not isinstance(self.min_partition, int) or self.min_partition <= 0
        ):
            raise ConfigError(f"min_partition must be a positive int, got {self.min_partition!r}")
        if self.num_poolings is not None:
            self.num_poolings = [float(p) for p in self.num_poolings]
            if not self.num_poolings or any(not p > 0 for p in self.num_poolings):
                raise ConfigError(
                    f"num_poolings must be a non-empty list of values > 0, got {self.num_poolings}"
                )
        dim = self.column_wise_shard_dim
        if dim is not None and (not isinstance(dim, int) or dim <= 0 or dim % 4 != 0):
            raise ConfigError(f"column_wise_shard_dim must be a positive multiple of 4, got {dim!r}")
        return self

    def per_feature(self, table: BaseEmbeddingConfig, default_batch_size: int) -> list[tuple[int, float]]:
        """``(batch_size, pooling_factor)`` of every feature of ``table``, broadcasting single values."""
        n = table.num_features or 1
        pooling = _broadcast(self.pooling_factors, n, "pooling_factors", table.name)
        batches = _broadcast(self.batch_sizes or [default_batch_size], n, "batch_sizes", table.name)
        return list(zip(batches, pooling))


def _parse(enum_type, value, argument: str):
    try:
        return enum_type(value)
    except ValueError:
        names = ", ".join(v.value for v in enum_type)
        raise ConfigError(f"{argument}: {value!r} is not one of {names}") from None


def _broadcast(values: list, n: int, argument: str, table: str) -> list:
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ConfigError(
            f"table {table!r}: {argument} has {len(values)} values but the table has {n} features "
            "(give one value per feature, or a single value for all)"
        )
    return list(values)
