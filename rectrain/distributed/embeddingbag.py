"""``torchrec.distributed.embeddingbag`` at rectrain's path: its sharder and the sharded collection."""

from rectrain.distributed.sharded_embedding_bag import ShardedEmbeddingBagCollection
from rectrain.distributed.sharders import EmbeddingBagCollectionSharder

__all__ = ["EmbeddingBagCollectionSharder", "ShardedEmbeddingBagCollection"]
