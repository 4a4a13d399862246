"""Table and optimizer configs, field-compatible with ``torchrec.modules.embedding_configs``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Any, NamedTuple

import torch

from rectrain.embedding.disk_tables import check_storage
from rectrain.errors import ConfigError


@unique
class PoolingType(Enum):
    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"


@unique
class DataType(Enum):
    """Storage type of a table's rows. Training uses FP32 (or FP16); the rest are serving formats."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT8 = "INT8"
    INT4 = "INT4"
    INT2 = "INT2"

    @property
    def bits(self) -> int:
        return {"FP32": 32, "FP16": 16, "BF16": 16, "INT8": 8, "INT4": 4, "INT2": 2}[self.value]


_DTYPE_TO_DATA_TYPE = {
    torch.float32: DataType.FP32,
    torch.float16: DataType.FP16,
    torch.bfloat16: DataType.BF16,
    torch.qint8: DataType.INT8,
    torch.quint8: DataType.INT8,
    torch.int8: DataType.INT8,
    torch.quint4x2: DataType.INT4,
    torch.quint2x4: DataType.INT2,
}


def dtype_to_data_type(dtype: torch.dtype) -> DataType:
    """The table ``DataType`` a torch quantization dtype stands for (TorchRec's mapping: ``qint8`` is INT8,
    ``quint4x2`` INT4, ``quint2x4`` INT2)."""
    try:
        return _DTYPE_TO_DATA_TYPE[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in _DTYPE_TO_DATA_TYPE)
        raise ConfigError(f"no table data type for {dtype}; choose one of {known}") from None


class QuantConfig(NamedTuple):
    """``torchrec.modules.embedding_configs.QuantConfig``: a qconfig whose ``weight()`` observer's dtype
    is the tables' storage type, ``activation()``'s the output dtype, ``per_table_weight_dtype`` the
    exceptions."""

    activation: Any
    weight: Any
    per_table_weight_dtype: dict[str, torch.dtype] | None = None


@dataclass
class BaseEmbeddingConfig:
    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    # TorchRec's field: called on blocks of the table's rows (``rectrain.embedding.init``) instead of the
    # uniform draw between weight_init_min and weight_init_max.
    init_fn: Callable[[Any], Any] | None = None
    # TorchRec's virtual-table fields: a key-value table whose rows are ``total_num_buckets`` buckets of
    # ``num_embeddings / total_num_buckets`` ids, sharded bucket by bucket. Unsharded, the table is a plain
    # table (as in TorchRec); TorchRec's enumerator API shards its row-wise options by bucket; rectrain's
    # planner refuses to plan a virtual table (it runs no key-value kernel).
    total_num_buckets: int | None = None
    use_virtual_table: bool = False
    virtual_table_eviction_policy: Any = None  # TorchRec's; only virtual tables (refused) consult it
    # rectrain's field: where the rows and their fused optimizer state live while training: "ram", or "disk"
    # (files on local disk mapped into memory, the page cache as the hot-row cache; CPU only; see
    # rectrain.embedding.disk_tables and docs/disk-tables.md). Results are the same either way.
    storage: str = "ram"

    def __post_init__(self) -> None:
        where = f"table {self.name!r}" if self.name else "embedding config"
        buckets = self.total_num_buckets
        if buckets is not None and (not isinstance(buckets, int) or buckets <= 0):
            raise ConfigError(f"{where}: total_num_buckets must be a positive int, got {buckets!r}")
        if not isinstance(self.num_embeddings, int) or self.num_embeddings <= 0:
            raise ConfigError(f"{where}: num_embeddings must be a positive int, got {self.num_embeddings!r}")
        if not isinstance(self.embedding_dim, int) or self.embedding_dim <= 0:
            raise ConfigError(f"{where}: embedding_dim must be a positive int, got {self.embedding_dim!r}")
        if isinstance(self.data_type, str):
            self.data_type = DataType(self.data_type.upper())
        self.storage = check_storage(self.storage, where)
        self.feature_names = list(self.feature_names)
        if not self.feature_names and self.name:
            # TorchRec requires feature_names; defaulting to the table name saves boilerplate for 1:1 tables.
            self.feature_names = [self.name]
        if len(set(self.feature_names)) != len(self.feature_names):
            raise ConfigError(f"{where}: feature_names has duplicates: {self.feature_names}")
        lo, hi = self.get_weight_init_min(), self.get_weight_init_max()
        if lo > hi:
            raise ConfigError(f"{where}: weight_init_min ({lo}) is greater than weight_init_max ({hi})")

    def get_weight_init_max(self) -> float:
        """Upper bound of the uniform initialisation; TorchRec's default is sqrt(1 / num_embeddings)."""
        if self.weight_init_max is None:
            return math.sqrt(1.0 / self.num_embeddings)
        return self.weight_init_max

    def get_weight_init_min(self) -> float:
        if self.weight_init_min is None:
            return -self.get_weight_init_max()
        return self.weight_init_min

    @property
    def num_features(self) -> int:
        return len(self.feature_names)


@dataclass
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """A table whose lookups are pooled (SUM or MEAN) into one vector per example and feature."""

    pooling: PoolingType = PoolingType.SUM

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.pooling, str):
            self.pooling = PoolingType(self.pooling.upper())
        if self.pooling == PoolingType.NONE:
            raise ConfigError(
                f"table {self.name!r}: EmbeddingBagConfig needs pooling SUM or MEAN; "
                "use EmbeddingConfig for unpooled (sequence) lookups"
            )


@dataclass
class EmbeddingConfig(BaseEmbeddingConfig):
    """A table whose lookups are returned per id (sequence embeddings), not pooled."""


@dataclass
class EmbeddingTableConfig(BaseEmbeddingConfig):
    """TorchRec's table description in sharding code: a table with its pooling and input weighting."""

    pooling: PoolingType = PoolingType.SUM
    is_weighted: bool = False
    has_feature_processor: bool = False
    embedding_names: list[str] = field(default_factory=list)


@unique
class EmbOptimType(Enum):
    """Optimizers that update embedding rows inside backward (no embedding gradient is materialised)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAM = "adam"


@dataclass
class FusedOptimizerConfig:
    """The fused embedding optimizer of a collection (TorchRec's ``fused_params``)."""

    optimizer: EmbOptimType = EmbOptimType.ROWWISE_ADAGRAD
    lr: float = 0.01
    eps: float = 1e-8
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    # CPU backward of SGD/Adagrad/row-wise Adagrad: "fbgemm", "native" (rectrain.embedding.native_backward)
    # or "auto" (per machine; the RECTRAIN_CPU_BACKWARD environment variable overrides "auto").
    cpu_backward: str = "auto"

    def __post_init__(self) -> None:
        if self.cpu_backward not in ("auto", "fbgemm", "native"):
            raise ConfigError(f"cpu_backward must be auto, fbgemm or native; got {self.cpu_backward!r}")
        if isinstance(self.optimizer, str):
            try:
                self.optimizer = EmbOptimType(self.optimizer.lower())
            except ValueError:
                names = ", ".join(o.value for o in EmbOptimType)
                raise ConfigError(f"optimizer must be one of {names}; got {self.optimizer!r}") from None
        if not self.lr >= 0:
            raise ConfigError(f"lr must be >= 0, got {self.lr}")
        if not self.eps > 0:
            raise ConfigError(f"eps must be > 0, got {self.eps}")
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ConfigError(f"beta1 and beta2 must lie in [0, 1), got {self.beta1}, {self.beta2}")

    def state_floats_per_row(self, embedding_dim: int) -> int:
        """fp32 optimizer-state values kept per table row (the planner's storage estimate uses this)."""
        return {
            EmbOptimType.SGD: 0,
            EmbOptimType.ADAGRAD: embedding_dim,
            EmbOptimType.ROWWISE_ADAGRAD: 1,
            EmbOptimType.ADAM: 2 * embedding_dim,
        }[self.optimizer]
