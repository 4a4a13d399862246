"""``torchrec.distributed.types`` at rectrain's path: the plan's vocabulary and the world a rank runs in."""

from rectrain.distributed.env import ShardingEnv
from rectrain.distributed.sharders import BaseEmbeddingSharder as ModuleSharder
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.types import ParameterSharding, ShardingType

__all__ = ["ModuleSharder", "ParameterSharding", "ShardingEnv", "ShardingPlan", "ShardingType"]
