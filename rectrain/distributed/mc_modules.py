"""``torchrec.distributed.mc_modules`` at rectrain's path: its sharder, refused (see ``mc_sharders``)."""

from rectrain.distributed.mc_sharders import ManagedCollisionCollectionSharder

__all__ = ["ManagedCollisionCollectionSharder"]
