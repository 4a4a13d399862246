"""``torchrec.distributed.types`` at rectrain's path: the plan's vocabulary, the world a rank runs in, torch's
shard metadata, FBGEMM's ``BoundsCheckMode`` and ``CacheAlgorithm``, and the awaitables and module base class
of TorchRec's sharded-module protocol."""

from enum import Enum

from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, CacheAlgorithm
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensorMetadata

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.interfaces.awaitable import Awaitable, LazyAwaitable, NoWait
from rectrain.distributed.interfaces.sharded_module import ShardedModule
from rectrain.distributed.parallel.sharders import BaseEmbeddingSharder as ModuleSharder
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.types import ParameterSharding, ShardingType


class PipelineType(Enum):
    """TorchRec's training pipelines, as its planner's storage estimate distinguishes them."""

    NONE = "none"
    TRAIN_BASE = "train_base"
    TRAIN_SPARSE_DIST = "train_sparse_dist"
    TRAIN_PREFETCH_SPARSE_DIST = "train_prefetch_sparse_dist"


__all__ = [
    "Awaitable",
    "BoundsCheckMode",
    "CacheAlgorithm",
    "LazyAwaitable",
    "ModuleSharder",
    "NoWait",
    "ParameterSharding",
    "PipelineType",
    "ShardMetadata",
    "ShardedModule",
    "ShardedTensorMetadata",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
]
