"""``torchrec.distributed.planner.planners`` at rectrain's path."""

from rectrain.planner.planner import EmbeddingShardingPlanner
from rectrain.planner.refusals import refusing_getattr

__all__ = ["EmbeddingShardingPlanner"]

__getattr__ = refusing_getattr(__name__)
