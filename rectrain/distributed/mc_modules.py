"""``torchrec.distributed.mc_modules`` at rectrain's path: its sharder (planning only; ``mc_sharders``)."""

from rectrain.distributed.parallel.mc_sharders import ManagedCollisionCollectionSharder

__all__ = ["ManagedCollisionCollectionSharder"]
