"""``torchrec.distributed.planner.partitioners`` at rectrain's path (``rectrain.planner.partitioners``)."""

from rectrain.planner.partitioners import (
    GreedyPerfPartitioner,
    MemoryBalancedPartitioner,
    OrderedDeviceHardware,
    ShardingOptionGroup,
    SortBy,
)

__all__ = [
    "GreedyPerfPartitioner",
    "MemoryBalancedPartitioner",
    "OrderedDeviceHardware",
    "ShardingOptionGroup",
    "SortBy",
]
