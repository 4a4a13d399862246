"""``torchrec.distributed.planner.types`` at rectrain's path: the planner's inputs, its records, its plan and
its error (the engine's own, ``rectrain.planner``)."""

import logging  # noqa: F401  (TorchRec's tests patch ``types.logging``; rectrain's Topology does not warn)

from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.context_hash import (
    hash_planner_context_inputs,
    hash_planner_context_inputs_str,
    hash_sha256_str,
    hash_sha256_to_int,
    round_to_nearest,
)
from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.plan_checks import PlanLoader
from rectrain.planner.protocols import Enumerator, Partitioner, Proposer, Stats
from rectrain.planner.refusals import refusing_getattr
from rectrain.planner.sharder_data import SharderData, StorageUsageType
from rectrain.planner.sharding_option import PartitionByType, Perf, ShardingOption
from rectrain.planner.topology import (
    BasicCommsBandwidths,
    CollectiveType,
    CustomTopologyData,
    DeviceHardware,
    GeneralizedCommsBandwidth,
    Storage,
    Topology,
)
from rectrain.planner.topology_factory import (
    HardwareConfig,
    KernelConfig,
    TopologyConfigBase,
    TopologyFactory,
    TrainerConfig,
)
from rectrain.planner.types import Shard

SharderDataMap = dict[str, SharderData]

__all__ = [
    "BasicCommsBandwidths",
    "CollectiveType",
    "CustomTopologyData",
    "DeviceHardware",
    "Enumerator",
    "GeneralizedCommsBandwidth",
    "HardwareConfig",
    "KernelConfig",
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
    "SharderDataMap",
    "ShardingOption",
    "ShardingPlan",
    "Storage",
    "StorageUsageType",
    "Topology",
    "TopologyConfigBase",
    "TopologyFactory",
    "TrainerConfig",
    "hash_planner_context_inputs",
    "hash_planner_context_inputs_str",
    "hash_sha256_str",
    "hash_sha256_to_int",
    "round_to_nearest",
]

__getattr__ = refusing_getattr(__name__)
