"""rectrain: TorchRec-compatible sparse types, FBGEMM embedding collections and sharded training.

The names a TorchRec user reaches for are importable from here; the sub-packages hold the rest.
"""

from rectrain.embedding import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
)
from rectrain.optim import CombinedOptimizer, KeyedOptimizer
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__version__ = "0.1.0"

__all__ = [
    "CombinedOptimizer",
    "DataType",
    "EmbOptimType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "FusedOptimizerConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedOptimizer",
    "KeyedTensor",
    "PoolingType",
    "__version__",
]
