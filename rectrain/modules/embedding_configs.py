"""``torchrec.modules.embedding_configs`` at rectrain's path (implemented in ``rectrain.embedding``)."""

from rectrain.embedding.config import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
)

__all__ = [
    "BaseEmbeddingConfig",
    "DataType",
    "EmbOptimType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "FusedOptimizerConfig",
    "PoolingType",
]
