"""The vocabulary of a sharding plan: sharding types, compute kernels, shards and a table's sharding.

Names and string values follow ``torchrec.distributed.types`` / ``torchrec.distributed.planner.types``
so that a TorchRec plan (and the code that builds one) ports by changing imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Any

from rectrain.errors import ConfigError

# Units and element sizes every estimate shares.
GB, GIB = 1000**3, 1024**3
ID_BYTES = 8  # one input id: FBGEMM's kernels take int64 ids (int32 ids are widened)
FP32_BYTES = 4  # an output value, a gradient, an optimizer state value


@unique
class ShardingType(str, Enum):
    """How one table is split across ranks (TorchRec's string values).

    ``TABLE_COLUMN_WISE`` and ``GRID_SHARD`` are TorchRec's names for layouts rectrain does not run
    (``PLANNED_SHARDING_TYPES`` are the ones it does): TorchRec-style sharders and constraints that name them
    port, TorchRec's enumerator API lists them when a sharder offers them, rectrain's planner never picks
    them, and a plan that uses one is refused with ``unsupported_reason``.
    """

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"

    def __str__(self) -> str:
        return self.value

    @property
    def unsupported_reason(self) -> str | None:
        """Why rectrain cannot run this sharding type (None for the types it runs)."""
        if self in PLANNED_SHARDING_TYPES:
            return None
        what = {
            "table_column_wise": "column shards placed within one host",
            "grid_shard": "row blocks within a host times column blocks across hosts",
        }[self.value]
        runs = ", ".join(t.value for t in PLANNED_SHARDING_TYPES)
        return f"sharding type {self.value!r} ({what}) is TorchRec's; rectrain runs only {runs}"


PLANNED_SHARDING_TYPES = (
    ShardingType.DATA_PARALLEL,
    ShardingType.TABLE_WISE,
    ShardingType.ROW_WISE,
    ShardingType.COLUMN_WISE,
    ShardingType.TABLE_ROW_WISE,
)


@unique
class EmbeddingComputeKernel(str, Enum):
    """How a shard is looked up and updated.

    ``fused``: FBGEMM table-batched embedding with the optimizer applied inside backward (no gradient tensor).
    ``dense``: a plain weight with a materialised gradient, stepped by a regular optimizer (the only kernel
    data-parallel tables use, because their gradient must be all-reduced).

    ``key_value``: TorchRec's SSD offloading; here the fused kernel over a disk table (``storage = "disk"``:
    rows in a file behind a RAM cache, ``rectrain.embedding.disk_cache``), CPU only. The planner proposes it
    only where a constraint's ``compute_kernels`` names it.

    The other members are TorchRec's names for kernels rectrain does not run (``RUNNABLE_KERNELS`` and
    ``key_value`` are the ones it does): they parse, so TorchRec code and constraints that name them port,
    the planner never proposes them, and a plan that uses one is refused with ``unsupported_reason``.
    """

    DENSE = "dense"
    FUSED = "fused"
    FUSED_UVM = "fused_uvm"
    FUSED_UVM_CACHING = "fused_uvm_caching"
    QUANT = "quant"
    QUANT_UVM = "quant_uvm"
    QUANT_UVM_CACHING = "quant_uvm_caching"
    KEY_VALUE = "key_value"
    CUSTOMIZED_KERNEL = "customized_kernel"
    SSD_VIRTUAL_TABLE = "ssd_virtual_table"
    DRAM_VIRTUAL_TABLE = "dram_virtual_table"
    DRAM_SSD_VIRTUAL_TABLE = "dram_ssd_virtual_table"
    FUSED_TRITON = "fused_triton"

    def __str__(self) -> str:
        return self.value

    @property
    def unsupported_reason(self) -> str | None:
        """Why rectrain cannot run this kernel (None for the kernels it runs)."""
        if self in RUNNABLE_KERNELS or self is EmbeddingComputeKernel.KEY_VALUE:
            return None
        what = _UNSUPPORTED[self.value]
        return (
            f"compute kernel {self.value!r} ({what}) is TorchRec's; rectrain runs only 'dense', 'fused' and "
            "'key_value' (disk tables, CPU)"
        )


_UNSUPPORTED = {
    "fused_uvm": "tables in host memory read through CUDA unified memory",
    "fused_uvm_caching": "tables in host memory behind a GPU cache",
    "quant": "quantized inference tables; rectrain serves them through recserve",
    "quant_uvm": "quantized inference tables in unified memory",
    "quant_uvm_caching": "quantized inference tables behind a GPU cache",
    "customized_kernel": "a user-registered kernel",
    "ssd_virtual_table": "an SSD-backed virtual table",
    "dram_virtual_table": "a host-memory key-value virtual table",
    "dram_ssd_virtual_table": "a host-memory and SSD key-value virtual table",
    "fused_triton": "Triton table-batched embeddings",
}
RUNNABLE_KERNELS = (EmbeddingComputeKernel.DENSE, EmbeddingComputeKernel.FUSED)


@dataclass(init=False, unsafe_hash=True)
class Shard:
    """A block of a table, ``rows [row_offset, row_offset + num_rows) x cols [col_offset, ...)``: the shard of
    a sharding option, of a plan, and TorchRec's planner ``Shard`` (``size`` ``[rows, cols]`` at ``offset``
    ``[row, col]``; ``Shard(size=..., offset=..., storage=..., perf=..., rank=...)`` builds one too).

    ``rank`` is None while the shard is not placed, and for data-parallel tables (replicated on every rank).
    ``storage`` and ``perf`` are estimates of what it needs and costs on its rank, informative only: bytes
    and seconds per iteration from rectrain's planner, TorchRec's ``Storage`` and ``Perf`` from its API.
    """

    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    rank: int | None = None
    storage: Any = field(default=None, compare=False)
    perf: Any = field(default=None, compare=False)

    def __init__(
        self, row_offset=0, num_rows=0, col_offset=0, num_cols=0, rank=None, storage=None, perf=None, *,
        size: list[int] | None = None, offset: list[int] | None = None,
    ) -> None:  # fmt: skip
        # Permissive, as TorchRec's record: a size or offset that is not a pair (TorchRec's tests pass
        # placeholders) leaves its fields None.
        offset = (row_offset, col_offset) if offset is None else offset
        size = (num_rows, num_cols) if size is None else size
        self.row_offset, self.col_offset = (*offset, None, None)[:2]
        self.num_rows, self.num_cols = (*size, None, None)[:2]
        self.rank, self.storage, self.perf = rank, storage, perf

    @property
    def offset(self) -> list[int]:
        """``[row_offset, col_offset]`` (TorchRec's ``Shard.offset``, ``ShardMetadata.shard_offsets``)."""
        return [self.row_offset, self.col_offset]

    @property
    def size(self) -> list[int]:
        """``[num_rows, num_cols]`` (TorchRec's ``Shard.size``, ``ShardMetadata.shard_sizes``)."""
        return [self.num_rows, self.num_cols]

    shard_offsets, shard_sizes = offset, size


@dataclass
class ParameterSharding:
    """How one table is sharded: its type, kernel, the rank of each shard, and the shards themselves.

    Mirrors ``torchrec.distributed.types.ParameterSharding``. ``ranks`` lists the rank of every shard in
    ``sharding_spec`` order (every rank for data-parallel tables).
    """

    sharding_type: ShardingType
    compute_kernel: EmbeddingComputeKernel
    ranks: list[int] | None = None
    sharding_spec: list[Shard] | None = None
    # The table's FBGEMM kernel options from its ParameterConstraints (TorchRec's fields; not in the JSON).
    cache_params: Any = None
    enforce_hbm: bool | None = None
    stochastic_rounding: bool | None = None
    bounds_check_mode: Any = None

    def __post_init__(self) -> None:
        try:
            self.sharding_type = ShardingType(self.sharding_type)
        except ValueError:
            names = ", ".join(t.value for t in ShardingType)
            raise ConfigError(f"sharding_type must be one of {names}; got {self.sharding_type!r}") from None
        if self.sharding_type.unsupported_reason:
            raise ConfigError(self.sharding_type.unsupported_reason)
        try:
            self.compute_kernel = EmbeddingComputeKernel(self.compute_kernel)
        except ValueError:
            names = ", ".join(k.value for k in EmbeddingComputeKernel)
            raise ConfigError(f"compute_kernel must be one of {names}; got {self.compute_kernel!r}") from None
        if self.compute_kernel.unsupported_reason:
            raise ConfigError(self.compute_kernel.unsupported_reason)
        if self.ranks is not None:
            self.ranks = list(self.ranks)
        if self.sharding_spec is not None:
            self.sharding_spec = list(self.sharding_spec)
