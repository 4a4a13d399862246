"""``torchrec.distributed.embedding_lookup`` at rectrain's path.

TorchRec's sharded collections hold their kernels in lookup modules built from kernel groups
(``GroupedEmbeddingsLookup``). rectrain's sharded collections build their kernels themselves
(``FusedTables``, one per rank), so the lookup module exists by name and refuses to be built, saying so.
"""

from __future__ import annotations

from typing import Any

from rectrain.distributed.interfaces.table_groups import GroupedEmbeddingConfig
from rectrain.errors import ConfigError
from rectrain.planner.types import EmbeddingComputeKernel

__all__ = ["EmbeddingComputeKernel", "GroupedEmbeddingsLookup"]


class GroupedEmbeddingsLookup:
    """TorchRec's per-rank lookup of sequence kernel groups; not available in rectrain."""

    def __init__(self, grouped_configs: list[GroupedEmbeddingConfig], *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            "GroupedEmbeddingsLookup is TorchRec's kernel container; rectrain's sharded collections "
            "(DistributedModelParallel, ShardedEmbeddingCollection) build their own FBGEMM kernels from the "
            "plan: shard the collection with DistributedModelParallel instead"
        )
