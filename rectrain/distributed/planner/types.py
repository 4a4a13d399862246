"""``torchrec.distributed.planner.types`` at rectrain's path: the planner's inputs, its plan and its error."""

from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.errors import PlannerError
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.topology import Topology

__all__ = ["ParameterConstraints", "PlannerError", "ShardingPlan", "Topology"]
