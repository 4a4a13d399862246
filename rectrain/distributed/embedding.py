"""``torchrec.distributed.embedding`` at rectrain's path: its sharder and the sharded collection."""

from rectrain.distributed.sharded_embedding import ShardedEmbeddingCollection
from rectrain.distributed.sharders import EmbeddingCollectionSharder

__all__ = ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"]
