"""``torchrec.distributed.planner.types`` at rectrain's path: the planner's inputs, its records, its plan and
its error."""

from rectrain.distributed.planner.sharding_option import PartitionByType, Perf, Shard, ShardingOption
from rectrain.distributed.planner.utils import SharderData
from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.errors import PlannerError
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.topology import DeviceHardware, Storage, Topology

__all__ = [
    "DeviceHardware",
    "ParameterConstraints",
    "PartitionByType",
    "Perf",
    "PlannerError",
    "Shard",
    "SharderData",
    "ShardingOption",
    "ShardingPlan",
    "Storage",
    "Topology",
]
