"""``torchrec.distributed.embeddingbag`` at rectrain's path: its sharder, the sharded collection, and the
per-batch context of TorchRec's sharded-module protocol."""

from rectrain.distributed.sharded_embedding_bag import ShardedEmbeddingBagCollection
from rectrain.distributed.sharders import EmbeddingBagCollectionSharder
from rectrain.distributed.sharding_contexts import EmbeddingBagCollectionContext
from rectrain.embedding import EmbeddingBagCollection

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagCollectionContext",
    "EmbeddingBagCollectionSharder",
    "ShardedEmbeddingBagCollection",
]
