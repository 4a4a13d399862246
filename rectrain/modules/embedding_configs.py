"""``torchrec.modules.embedding_configs`` at rectrain's path (implemented in ``rectrain.embedding``)."""

from dataclasses import dataclass

from rectrain.embedding.config import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
    QuantConfig,
    dtype_to_data_type,
)

__all__ = [
    "BaseEmbeddingConfig",
    "DataType",
    "EmbOptimType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "FusedOptimizerConfig",
    "NoEvictionPolicy",
    "PoolingType",
    "QuantConfig",
    "VirtualTableEvictionPolicy",
    "dtype_to_data_type",
]


@dataclass
class VirtualTableEvictionPolicy:
    """TorchRec's eviction policy of a virtual (key-value) table. rectrain runs no key-value kernel (see
    ``EmbeddingComputeKernel.unsupported_reason``), so a policy describes a table it would refuse to shard."""

    meta_header_len: int = 0
    embedding_dim: int = 0
    initialized: bool = False


@dataclass
class NoEvictionPolicy(VirtualTableEvictionPolicy):
    """A virtual table that never evicts."""
