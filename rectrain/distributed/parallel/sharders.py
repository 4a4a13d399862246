"""TorchRec's sharder objects, reduced to what rectrain reads from them: the sharding types they offer.

TorchRec code passes ``sharders=[EmbeddingBagCollectionSharder()]`` to the planner and to
``DistributedModelParallel``; rectrain shards every collection itself, so a sharder here narrows the sharding
types and compute kernels the planner may pick, and its ``fused_params`` choose the fused optimizer of the
collections built TorchRec's way (``rectrain.distributed.parallel.fused_params`` takes them or refuses them).
Quantized communication (``qcomm_codecs_registry``) is refused: rectrain's collectives are not quantized.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from torch import nn

from rectrain.distributed.parallel.fused_params import config_from_fused_params
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.errors import ConfigError
from rectrain.planner.types import PLANNED_SHARDING_TYPES, EmbeddingComputeKernel, ShardingType

M = TypeVar("M", bound=nn.Module)


class BaseQuantEmbeddingSharder(Generic[M]):
    """TorchRec's base of quantized-inference sharders (rectrain's refuse to shard)."""


class BaseEmbeddingSharder(Generic[M]):
    """Offers every sharding type rectrain plans (TorchRec's CPU sharders offer data-parallel, table-wise and
    column-wise only) and, per type, the kernel rectrain runs it with. Generic in the module type, as
    TorchRec's ``ModuleSharder[M]``, so annotations such as ``ModuleSharder[nn.Module]`` port."""

    module_type: type[nn.Module] = nn.Module

    def __init__(self, fused_params: dict[str, Any] | None = None, qcomm_codecs_registry: Any = None) -> None:
        if qcomm_codecs_registry:
            raise ConfigError(
                f"{type(self).__name__}(qcomm_codecs_registry=...): rectrain's collectives are not "
                "quantized; pass qcomm_codecs_registry=None (TorchRec's examples do on CPU)"
            )
        if fused_params:
            config_from_fused_params(fused_params, f"{type(self).__name__}(fused_params=...)")  # refuse early
        self.fused_params: dict[str, Any] | None = dict(fused_params) if fused_params else None
        self.qcomm_codecs_registry = None

    def sharding_types(self, compute_device_type: str) -> list[str]:
        """The sharding types the planner may pick for this sharder's module type (TorchRec's values)."""
        return [t.value for t in PLANNED_SHARDING_TYPES]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        """Data-parallel tables train densely (their gradient is all-reduced); others use the fused kernel."""
        if str(sharding_type) == ShardingType.DATA_PARALLEL.value:
            return [EmbeddingComputeKernel.DENSE.value]
        return [EmbeddingComputeKernel.FUSED.value]

    def shard(
        self, module: M, params: Any, env: Any, device: Any = None, module_fqn: str | None = None
    ) -> nn.Module:
        """``module`` sharded by ``params`` (``{table: ParameterSharding}``) on ``env``'s ranks, as
        TorchRec's sharders do (``rectrain.distributed.shard.shard`` with this sharder)."""
        # Imported here: module_sharding imports the DMP machinery, which reads sharders.
        from rectrain.distributed.parallel.module_sharding import shard_module

        return shard_module(module, params, env, device, sharder=self)

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        """``{table name: weight}`` of the collection's tables (what TorchRec's planner enumerates)."""
        return table_weights(module)


def table_weights(module: nn.Module) -> dict[str, nn.Parameter]:
    """``{table name: weight}`` of an embedding collection, read from its ``embedding_bags`` /
    ``embeddings`` (``<table>.weight``, in table order), whether built TorchRec's way or fused."""
    tables = getattr(module, "embedding_bags", None)
    if tables is None:
        tables = getattr(module, "embeddings", None)
    if not isinstance(tables, nn.Module):
        raise ConfigError(
            f"{type(module).__name__} is not an embedding collection: it has no tables to shard"
        )
    return {name.split(".")[0]: param for name, param in tables.named_parameters()}


class EmbeddingBagCollectionSharder(BaseEmbeddingSharder):
    """``torchrec.distributed.embeddingbag.EmbeddingBagCollectionSharder``."""

    module_type = EmbeddingBagCollection


class EmbeddingCollectionSharder(BaseEmbeddingSharder):
    """``torchrec.distributed.embedding.EmbeddingCollectionSharder``."""

    module_type = EmbeddingCollection


def get_default_sharders() -> list[BaseEmbeddingSharder]:
    """One sharder per collection type, as ``torchrec.distributed.sharding_plan.get_default_sharders``."""
    return [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]


def apply_to_all(
    module: nn.Module, parameter_sharding_generator: Any, sharder: object | None = None
) -> dict[str, Any]:
    """``{table: parameter_sharding_generator}`` for every table ``sharder`` (default: the module type's
    default sharder) shards in ``module``: ``construct_module_sharding_plan``'s ``per_param_sharding``."""
    if sharder is None:
        sharder = next((s for s in get_default_sharders() if isinstance(module, s.module_type)), None)
    if sharder is None or not isinstance(module, sharder.module_type):
        raise ConfigError(f"apply_to_all: no sharder for a {type(module).__name__} (given: {sharder!r})")
    return dict.fromkeys(sharder.shardable_parameters(module), parameter_sharding_generator)
