"""Embedding tables on FBGEMM kernels: configs, collections and their fused optimizers."""

from rectrain.embedding.config import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
)
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection

__all__ = [
    "BaseEmbeddingConfig",
    "DataType",
    "EmbOptimType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "FusedOptimizerConfig",
    "PoolingType",
]
