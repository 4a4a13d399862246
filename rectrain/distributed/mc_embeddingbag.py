"""``torchrec.distributed.mc_embeddingbag`` at rectrain's path: its sharder, refused (see ``mc_sharders``)."""

from rectrain.distributed.mc_sharders import ManagedCollisionEmbeddingBagCollectionSharder

__all__ = ["ManagedCollisionEmbeddingBagCollectionSharder"]
