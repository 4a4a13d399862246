"""TorchRec's managed-collision sharders, for planning only.

TorchRec shards a managed-collision collection row-wise together with its remappers; rectrain's
``DistributedModelParallel`` does not shard managed-collision modules yet (it refuses a model holding one,
naming it: see ``model_parallel.refuse_managed_collision``). The sharders exist so that TorchRec code that
plans with them ports: they offer what TorchRec's offer that rectrain runs (row-wise, the fused kernel), and
TorchRec's enumerator API (``rectrain.distributed.planner.enumerators``) lists the tables of the module
inside. Nothing shards with them.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rectrain.distributed.parallel.sharders import BaseEmbeddingSharder, table_weights
from rectrain.planner.types import EmbeddingComputeKernel, ShardingType
from rectrain.zch.collection import ManagedCollisionCollection
from rectrain.zch.embedding import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)


class _ManagedCollisionSharder(BaseEmbeddingSharder):
    def __init__(self, *sharders: Any, qcomm_codecs_registry: Any = None, **named_sharders: Any) -> None:
        # TorchRec's take the collection's sharder and the remappers' (``ebc_sharder``, ``mc_sharder``, ...);
        # the estimate reads the collection sharder's fused params.
        given = [s for s in (*sharders, *named_sharders.values()) if s is not None]
        fused_params = next((s.fused_params for s in given if getattr(s, "fused_params", None)), None)
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)

    def sharding_types(self, compute_device_type: str) -> list[str]:
        # Remappers are row-wise sharded with their rows, as in TorchRec.
        return [ShardingType.ROW_WISE.value]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [EmbeddingComputeKernel.FUSED.value]

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        inner = getattr(module, "_embedding_module", module)
        return table_weights(inner)


class ManagedCollisionCollectionSharder(_ManagedCollisionSharder):
    """``torchrec.distributed.mc_modules.ManagedCollisionCollectionSharder`` (planning only)."""

    module_type = ManagedCollisionCollection

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        return {}  # remappers hold buffers, not tables


class ManagedCollisionEmbeddingBagCollectionSharder(_ManagedCollisionSharder):
    """``torchrec.distributed.mc_embeddingbag.ManagedCollisionEmbeddingBagCollectionSharder``."""

    module_type = ManagedCollisionEmbeddingBagCollection


class ManagedCollisionEmbeddingCollectionSharder(_ManagedCollisionSharder):
    """``torchrec.distributed.mc_embedding.ManagedCollisionEmbeddingCollectionSharder`` (planning only)."""

    module_type = ManagedCollisionEmbeddingCollection
