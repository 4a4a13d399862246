"""``torchrec.distributed.mc_embedding`` at rectrain's path: its sharder, refused (see ``mc_sharders``)."""

from rectrain.distributed.mc_sharders import ManagedCollisionEmbeddingCollectionSharder

__all__ = ["ManagedCollisionEmbeddingCollectionSharder"]
