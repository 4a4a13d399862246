"""``torchrec.distributed.mc_embedding_modules`` at rectrain's path: refused (``rectrain.zch.sharded``)."""

from rectrain.zch.sharded import BaseShardedManagedCollisionEmbeddingCollection

__all__ = ["BaseShardedManagedCollisionEmbeddingCollection"]
