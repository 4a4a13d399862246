"""``torchrec.modules.mc_modules`` at rectrain's path (implemented in ``rectrain.zch``)."""

from rectrain.zch.collection import ManagedCollisionCollection
from rectrain.zch.eviction import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    MCHEvictionPolicyMetadataInfo,
)
from rectrain.zch.filters import (
    average_threshold_filter,
    dynamic_threshold_filter,
    probabilistic_threshold_filter,
)
from rectrain.zch.mch import MCHManagedCollisionModule
from rectrain.zch.module import ManagedCollisionModule

__all__ = [
    "DistanceLFU_EvictionPolicy",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "MCHManagedCollisionModule",
    "ManagedCollisionCollection",
    "ManagedCollisionModule",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "probabilistic_threshold_filter",
]
