"""``torchrec.distributed.planner.types`` at rectrain's path: the planner's inputs, its records, its plan and
its error."""

from rectrain.distributed.planner.utils import SharderData
from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.plan_checks import PlanLoader
from rectrain.planner.protocols import Enumerator, Partitioner, Proposer, Stats
from rectrain.planner.refusals import refusing_getattr
from rectrain.planner.sharding_option import PartitionByType, Perf, ShardingOption
from rectrain.planner.topology import DeviceHardware, Storage, Topology
from rectrain.planner.types import Shard

__all__ = [
    "DeviceHardware",
    "Enumerator",
    "Partitioner",
    "Proposer",
    "Stats",
    "ParameterConstraints",
    "PartitionByType",
    "PlanLoader",
    "Perf",
    "PlannerError",
    "PlannerErrorType",
    "Shard",
    "SharderData",
    "ShardingOption",
    "ShardingPlan",
    "Storage",
    "Topology",
]

__getattr__ = refusing_getattr(__name__)
