"""``torchrec.distributed.mc_embedding`` at rectrain's path: its sharder (planning only; ``mc_sharders``); the
sharded module is refused (``rectrain.zch.sharded``)."""

from rectrain.distributed.interfaces.kjt_list import KJTList
from rectrain.distributed.parallel.mc_sharders import ManagedCollisionEmbeddingCollectionSharder
from rectrain.zch.sharded import ShardedManagedCollisionEmbeddingCollection

__all__ = [
    "KJTList",
    "ManagedCollisionEmbeddingCollectionSharder",
    "ShardedManagedCollisionEmbeddingCollection",
]
