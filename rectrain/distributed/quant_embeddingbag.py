"""``torchrec.distributed.quant_embeddingbag`` at rectrain's path: the quantized collection's names.

TorchRec shards quantized collections over GPUs for its inference server. rectrain's quantized collection
(``rectrain.quant.EmbeddingBagCollection``, recserve's int-N lookups) is not sharded in process: recserve
places its tables over serving devices when the model is exported. The sharder exists so that code naming
it ports; ``DistributedModelParallel`` refuses it (``unsupported_reason``), as does its ``shard``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from torch import nn

from rectrain.distributed.parallel.sharders import BaseQuantEmbeddingSharder
from rectrain.inference.refusals import refused
from rectrain.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

__all__ = [
    "QuantEmbeddingBagCollection",
    "QuantEmbeddingBagCollectionSharder",
    "QuantFeatureProcessedEmbeddingBagCollectionSharder",
    "ShardedQuantEmbeddingBagCollection",
]


class QuantEmbeddingBagCollectionSharder(BaseQuantEmbeddingSharder):
    """TorchRec's sharder of quantized collections for GPU inference (refused when used to shard)."""

    module_type: type[nn.Module] = QuantEmbeddingBagCollection

    def __init__(
        self,
        fused_params: dict[str, Any] | None = None,
        qcomm_codecs_registry: Any = None,
        shardable_params: list[str] | None = None,
    ) -> None:
        # TorchRec's inference fused params (register_tbe, quant_state_dict_split_scale_bias, ...) are kept
        # as given: nothing reads them, since nothing is sharded.
        self.fused_params = dict(fused_params) if fused_params else None
        self.qcomm_codecs_registry = qcomm_codecs_registry

    @property
    def unsupported_reason(self) -> str:
        """Why ``DistributedModelParallel`` refuses this sharder."""
        return str(refused("QuantEmbeddingBagCollectionSharder"))

    def shard(
        self, module: nn.Module, params: Any, env: Any, device: Any = None, module_fqn: Any = None
    ) -> NoReturn:
        raise refused("QuantEmbeddingBagCollectionSharder")


class QuantFeatureProcessedEmbeddingBagCollectionSharder(QuantEmbeddingBagCollectionSharder):
    """TorchRec's sharder of feature-processed quantized collections, which rectrain does not have."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise refused("QuantFeatureProcessedEmbeddingBagCollectionSharder")


class ShardedQuantEmbeddingBagCollection(nn.Module):
    """TorchRec's GPU-sharded quantized collection; refuses to be built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise refused("ShardedQuantEmbeddingBagCollection")
