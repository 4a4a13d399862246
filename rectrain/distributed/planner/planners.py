"""``torchrec.distributed.planner.planners`` at rectrain's path (the planner is ``rectrain.planner``'s)."""

from rectrain.planner.plan_checks import (
    extract_plan,
    validate_compute_kernels,
    validate_modules_inclusion_in_sharding_plan,
)
from rectrain.planner.planner import EmbeddingShardingPlanner
from rectrain.planner.refusals import refusing_getattr

__all__ = [
    "EmbeddingShardingPlanner",
    "extract_plan",
    "validate_compute_kernels",
    "validate_modules_inclusion_in_sharding_plan",
]

__getattr__ = refusing_getattr(__name__)
