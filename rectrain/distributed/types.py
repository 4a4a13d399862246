"""``torchrec.distributed.types`` at rectrain's path: the plan's vocabulary, the world a rank runs in, torch's
shard metadata, FBGEMM's ``BoundsCheckMode`` and ``CacheAlgorithm``, and the awaitables and module base class
of TorchRec's sharded-module protocol."""

import abc
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, CacheAlgorithm
from fbgemm_gpu.split_table_batched_embeddings_ops_training import MultiPassPrefetchConfig
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensor, ShardedTensorMetadata

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.interfaces.awaitable import (
    Awaitable,
    GetItemLazyAwaitable,
    LazyAwaitable,
    LazyGetItemMixin,
    LazyNoWait,
    NoWait,
)
from rectrain.distributed.interfaces.bucketize import ShardingBucketMetadata
from rectrain.distributed.interfaces.sharded_module import ShardedModule
from rectrain.distributed.parallel.dmp_collection import (
    DMPCollectionConfig,
    DMPCollectionContext,
    ShardingStrategy,
)
from rectrain.distributed.parallel.sharders import BaseEmbeddingSharder as ModuleSharder
from rectrain.embedding.config import DataType
from rectrain.planner.constraints import KeyValueParams
from rectrain.planner.plan import ModulePlan as EmbeddingModuleShardingPlan
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.shard_estimators import PipelineType
from rectrain.planner.sharder_data import StorageUsageType
from rectrain.planner.types import ParameterSharding, ShardingType


class CacheStatistics(abc.ABC):
    """What the UVM-cache scale-up knows of a table's access pattern (TorchRec's interface; rectrain runs
    no UVM cache, its planner records read it)."""

    @property
    @abc.abstractmethod
    def expected_lookups(self) -> float: ...

    @abc.abstractmethod
    def expected_miss_rate(self, clf: float) -> float: ...

    @property
    @abc.abstractmethod
    def cacheability(self) -> float: ...


@dataclass
class CacheParams:
    """TorchRec's UVM-cache settings of a table (``ParameterConstraints(cache_params=...)``): the planner's
    storage estimate reads them; a plan that uses UVM caching is refused (rectrain keeps each shard whole in
    its rank's memory)."""

    algorithm: CacheAlgorithm | None = None
    load_factor: float | None = None
    reserved_memory: float | None = None
    precision: DataType | None = None
    prefetch_pipeline: bool | None = None
    stats: Any = None
    multipass_prefetch_config: Any = None

    def __hash__(self) -> int:
        fields = (self.algorithm, self.load_factor, self.reserved_memory, self.precision)
        return hash((*fields, self.prefetch_pipeline, self.multipass_prefetch_config))


class CommOp(Enum):
    """TorchRec's quantized-collective names (keys of a ``qcomm_codecs_registry``, which rectrain refuses)."""

    POOLED_EMBEDDINGS_ALL_TO_ALL = "pooled_embeddings_all_to_all"
    POOLED_EMBEDDINGS_REDUCE_SCATTER = "pooled_embeddings_reduce_scatter"
    SEQUENCE_EMBEDDINGS_ALL_TO_ALL = "sequence_embeddings_all_to_all"


__all__ = [
    "CommOp",
    "KeyValueParams",
    "StorageUsageType",
    "Awaitable",
    "BoundsCheckMode",
    "CacheAlgorithm",
    "CacheParams",
    "CacheStatistics",
    "DataType",
    "DMPCollectionConfig",
    "DMPCollectionContext",
    "EmbeddingModuleShardingPlan",
    "GetItemLazyAwaitable",
    "KeyValueParams",
    "LazyAwaitable",
    "LazyGetItemMixin",
    "LazyNoWait",
    "ModuleSharder",
    "MultiPassPrefetchConfig",
    "NoWait",
    "ParameterSharding",
    "PipelineType",
    "ShardMetadata",
    "ShardedModule",
    "ShardedTensor",
    "ShardedTensorMetadata",
    "ShardingBucketMetadata",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingStrategy",
    "ShardingType",
]
