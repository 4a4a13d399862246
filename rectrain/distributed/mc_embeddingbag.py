"""``torchrec.distributed.mc_embeddingbag`` at rectrain's path: a planning-only sharder (``mc_sharders``)."""

from rectrain.distributed.parallel.mc_sharders import ManagedCollisionEmbeddingBagCollectionSharder

__all__ = ["ManagedCollisionEmbeddingBagCollectionSharder"]
