"""``torchrec.distributed.embeddingbag`` at rectrain's path: its sharder, the sharded collection, and the
per-batch context of TorchRec's sharded-module protocol."""

from rectrain.distributed.interfaces.contexts import EmbeddingBagCollectionContext
from rectrain.distributed.parallel.sharders import EmbeddingBagCollectionSharder
from rectrain.distributed.sharded.embedding_bag import ShardedEmbeddingBagCollection
from rectrain.embedding import EmbeddingBagCollection

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagCollectionContext",
    "EmbeddingBagCollectionSharder",
    "ShardedEmbeddingBagCollection",
]
