"""``torchrec.distributed.embedding_types`` at rectrain's path: the compute kernels a plan names, ``KJTList``,
the shard descriptions that kernels are grouped by, and the sharded-module base class."""

from rectrain.distributed.interfaces.kjt_list import KJTList
from rectrain.distributed.interfaces.sharded_module import ShardedEmbeddingModule, ShardedModule
from rectrain.distributed.interfaces.table_groups import GroupedEmbeddingConfig, ShardedEmbeddingTable
from rectrain.distributed.parallel.sharders import BaseEmbeddingSharder, BaseQuantEmbeddingSharder
from rectrain.planner.types import EmbeddingComputeKernel, ShardingType

__all__ = [
    "BaseEmbeddingSharder",
    "BaseQuantEmbeddingSharder",
    "EmbeddingComputeKernel",
    "GroupedEmbeddingConfig",
    "KJTList",
    "ShardedEmbeddingModule",
    "ShardedEmbeddingTable",
    "ShardedModule",
    "ShardingType",
]
