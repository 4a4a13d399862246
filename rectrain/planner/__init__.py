"""Sharding planner: decide which rank holds which rows and columns of every embedding table.

Mirrors ``torchrec.distributed.planner``: build a :class:`Topology`, optionally per-table
:class:`ParameterConstraints`, then ``EmbeddingShardingPlanner(topology, batch_size).plan(tables)``.
"""

from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.errors import PlannerError
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.planner import EmbeddingShardingPlanner
from rectrain.planner.topology import Topology
from rectrain.planner.types import EmbeddingComputeKernel, ParameterSharding, Shard, ShardingType

__all__ = [
    "EmbeddingComputeKernel",
    "EmbeddingShardingPlanner",
    "ParameterConstraints",
    "ParameterSharding",
    "PlannerError",
    "Shard",
    "ShardingPlan",
    "ShardingType",
    "Topology",
]
