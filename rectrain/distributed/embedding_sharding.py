"""``torchrec.distributed.embedding_sharding`` at rectrain's path: row-wise bucketing and kernel grouping."""

from dataclasses import dataclass
from typing import Any

import torch

from rectrain.distributed.interfaces import table_groups
from rectrain.distributed.interfaces.bucketize import bucketize_kjt_before_all2all
from rectrain.distributed.interfaces.contexts import set_sharding_context_post_a2a

_get_weighted_avg_cache_load_factor = table_groups._get_weighted_avg_cache_load_factor
_get_grouping_fused_params = table_groups._get_grouping_fused_params
_get_compute_kernel_type = table_groups._get_compute_kernel_type
_prefetch_and_cached = table_groups._prefetch_and_cached
group_tables = table_groups.group_tables
_set_sharding_context_post_a2a = set_sharding_context_post_a2a

__all__ = ["EmbeddingShardingInfo", "bucketize_kjt_before_all2all", "group_tables"]


@dataclass
class EmbeddingShardingInfo:
    """A table as sharding code sees it: its config, its plan entry and its weight."""

    embedding_config: Any  # EmbeddingTableConfig
    param_sharding: Any  # ParameterSharding
    param: torch.Tensor
    fused_params: dict[str, Any] | None = None
