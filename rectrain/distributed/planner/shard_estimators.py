"""``torchrec.distributed.planner.shard_estimators`` at rectrain's path: TorchRec's storage rule, the
planner's own (``rectrain.planner.shard_estimators``), and the planner's perf model
(``rectrain.planner.perf``: its figures, not TorchRec's)."""

from rectrain.planner.perf import EmbeddingPerfEstimator
from rectrain.planner.shard_estimators import (
    EmbeddingStorageEstimator,
    PipelineType,
    _calculate_dp_shard_io_sizes,
    _calculate_shard_io_sizes,
    _calculate_storage_specific_sizes,
    _calculate_tw_shard_io_sizes,
    _get_optimizer_multipler,
    calculate_pipeline_io_cost,
    calculate_shard_storages,
    get_num_poolings,
)

__all__ = [
    "EmbeddingPerfEstimator",
    "EmbeddingStorageEstimator",
    "PipelineType",
    "_calculate_dp_shard_io_sizes",
    "_calculate_shard_io_sizes",
    "_calculate_storage_specific_sizes",
    "_calculate_tw_shard_io_sizes",
    "_get_optimizer_multipler",
    "calculate_pipeline_io_cost",
    "calculate_shard_storages",
    "get_num_poolings",
]
