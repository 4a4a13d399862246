"""``torchrec.distributed.mc_embedding`` at rectrain's path: its sharder (planning only; ``mc_sharders``)."""

from rectrain.distributed.parallel.mc_sharders import ManagedCollisionEmbeddingCollectionSharder

__all__ = ["ManagedCollisionEmbeddingCollectionSharder"]
