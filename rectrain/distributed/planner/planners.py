"""``torchrec.distributed.planner.planners`` at rectrain's path."""

from rectrain.planner.planner import EmbeddingShardingPlanner

__all__ = ["EmbeddingShardingPlanner"]
