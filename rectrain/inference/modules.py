"""``torchrec.inference.modules`` at rectrain's path: quantize a trained model's collections for inference.

``quantize_embeddings`` swaps as TorchRec's does (through ``torch.ao.quantization.quantize_dynamic``, which
torch deprecates, so the few lines of the swap are here): every submodule below the root whose type is
exactly ``EmbeddingBagCollection`` (or a type of ``additional_qconfig_spec_keys``) becomes
``rectrain.quant.EmbeddingBagCollection`` (recserve's int-N lookups), built by ``from_float`` from the
module with its ``qconfig`` set; the root is never swapped (torch's ``convert`` swaps children only). As in
TorchRec, a collection that ``DistributedModelParallel`` has sharded is not an ``EmbeddingBagCollection``
and stays as it is (TorchRec's retrieval example quantizes its DMP model this way and saves the float,
sharded state); rectrain also logs a warning naming it. Quantize the unsharded model (``state_dict_gather``
into it) instead.

Serving a quantized model is recserve's job: ``recserve.export.export_package(model=...)`` takes the model
(quantized or not) and ``recserve.runtime.Predictor`` serves the package. TorchRec's torch.deploy serving
interfaces and its sharding of quantized models for GPUs are refused by name (``refusals``).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from rectrain.distributed.sharded.embedding_bag import ShardedEmbeddingBagCollection
from rectrain.embedding.config import QuantConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.errors import ConfigError
from rectrain.inference.refusals import refused
from rectrain.planner import ShardingPlan
from rectrain.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection
from rectrain.quant.embedding_modules import (
    quant_prep_enable_cache_features_order,
    quant_prep_enable_register_tbes,
)

logger = logging.getLogger(__name__)

DEFAULT_QUANTIZATION_DTYPE: torch.dtype = torch.int8


def trim_torch_package_prefix_from_typename(typename: str) -> str:
    """``typename`` without a ``<torch_package_N>.`` prefix (a class loaded through torch.package)."""
    if typename.startswith("<torch_package_"):
        return ".".join(typename.split(".")[1:])
    return typename


DEFAULT_QUANT_MAPPING: dict[str, type[nn.Module]] = {
    trim_torch_package_prefix_from_typename(
        torch.typename(EmbeddingBagCollection)
    ): QuantEmbeddingBagCollection,
}


def _warn_sharded(module: nn.Module) -> None:
    sharded = [name for name, m in module.named_modules() if isinstance(m, ShardedEmbeddingBagCollection)]
    if sharded:
        logger.warning(
            "quantize_embeddings: %s sharded by DistributedModelParallel stay float and sharded (as in "
            "TorchRec); gather them into an unsharded model (state_dict_gather) to quantize them",
            sharded,
        )


def quantize_embeddings(
    module: nn.Module,
    dtype: torch.dtype,
    inplace: bool,
    additional_qconfig_spec_keys: list[type[nn.Module]] | None = None,
    additional_mapping: dict[type[nn.Module], type[nn.Module]] | None = None,
    output_dtype: torch.dtype = torch.float,
    per_table_weight_dtype: dict[str, torch.dtype] | None = None,
) -> nn.Module:
    """``module`` with its ``EmbeddingBagCollection``s swapped for quantized ones storing ``dtype``
    (``torch.qint8``/``int8``, ``quint4x2``, ``quint2x4``, ``float16``, ``float32``;
    ``per_table_weight_dtype`` overrides it per table) and pooling into ``output_dtype``. ``inplace=False``
    works on a deep copy."""
    qconfig = QuantConfig(
        activation=partial(DtypePlaceholder, output_dtype),
        weight=partial(DtypePlaceholder, dtype),
        per_table_weight_dtype=per_table_weight_dtype,
    )
    qconfig_spec: dict[type[nn.Module], QuantConfig] = {EmbeddingBagCollection: qconfig}
    mapping: dict[type[nn.Module], type[nn.Module]] = {EmbeddingBagCollection: QuantEmbeddingBagCollection}
    for key in additional_qconfig_spec_keys or []:
        qconfig_spec[key] = qconfig
    mapping.update(additional_mapping or {})
    _warn_sharded(module)
    if not inplace:
        module = copy.deepcopy(module)
    _swap_children(module, qconfig_spec, mapping)
    return module


def _swap_children(
    module: nn.Module, qconfig_spec: dict[type[nn.Module], QuantConfig], mapping: dict[type[nn.Module], type]
) -> None:
    """Replace each child whose exact type has a qconfig and a mapping by its quantized module; recurse
    into the others (a swapped module's children go with it)."""
    for name, child in module.named_children():
        kind = type(child)
        if kind in qconfig_spec and kind in mapping:
            child.qconfig = qconfig_spec[kind]
            setattr(module, name, mapping[kind].from_float(child))
            del child.qconfig
        else:
            _swap_children(child, qconfig_spec, mapping)


@dataclass(frozen=True)
class DtypePlaceholder:
    """What ``QuantConfig``'s ``weight()``/``activation()`` give: the dtype (TorchRec uses torch's
    ``PlaceholderObserver``, which ``from_float`` reads only for its ``dtype``)."""

    dtype: torch.dtype


def quantize_inference_model(
    model: nn.Module,
    quantization_mapping: dict[str, type[nn.Module]] | None = None,
    per_table_weight_dtype: dict[str, torch.dtype] | None = None,
    fp_weight_dtype: torch.dtype = DEFAULT_QUANTIZATION_DTYPE,
    quantization_dtype: torch.dtype = DEFAULT_QUANTIZATION_DTYPE,
    output_dtype: torch.dtype = torch.float,
) -> nn.Module:
    """Quantize ``model`` in place: every module whose type name is a key of ``quantization_mapping``
    (default: ``EmbeddingBagCollection``) becomes its quantized counterpart; returns ``model``.

    ``EmbeddingCollection`` has no quantized counterpart here (recserve serves pooled lookups only), so a
    model holding one is refused rather than served half float; ``fp_weight_dtype`` is TorchRec's for
    feature-processed collections, which rectrain does not have."""
    mapping = DEFAULT_QUANT_MAPPING if quantization_mapping is None else quantization_mapping
    unpooled = [name for name, m in model.named_modules() if isinstance(m, EmbeddingCollection)]
    if unpooled:
        raise ConfigError(
            f"quantize_inference_model: {unpooled} are EmbeddingCollections (sequence lookups), which "
            "have no quantized lookup in rectrain/recserve; quantize_embeddings quantizes the "
            "EmbeddingBagCollections and leaves them float"
        )
    spec_keys, additional = [], {}
    for _, submodule in model.named_modules():
        typename = trim_torch_package_prefix_from_typename(torch.typename(submodule))
        if typename in mapping and type(submodule) not in additional:
            spec_keys.append(type(submodule))
            additional[type(submodule)] = mapping[typename]
    quant_prep_enable_register_tbes(model, list(additional))
    quant_prep_enable_cache_features_order(model, [EmbeddingBagCollection])
    quantize_embeddings(
        model,
        dtype=quantization_dtype,
        inplace=True,
        additional_qconfig_spec_keys=spec_keys,
        additional_mapping=additional,
        output_dtype=output_dtype,
        per_table_weight_dtype=per_table_weight_dtype,
    )
    logger.info("quantization dtype %s, per table %s", quantization_dtype, per_table_weight_dtype)
    return model


def shard_quant_model(
    model: nn.Module,
    world_size: int = 1,
    compute_device: str = "cuda",
    sharding_device: str = "meta",
    sharders: list[Any] | None = None,
    device_memory_size: int | None = None,
    constraints: dict[str, Any] | None = None,
    ddr_cap: int | None = None,
    sharding_plan: ShardingPlan | None = None,
) -> tuple[nn.Module, ShardingPlan]:
    """TorchRec shards a quantized model over GPUs for inference; refused (see ``refusals``): recserve
    places the quantized tables over serving devices when the model is exported."""
    raise refused("shard_quant_model")


_REFUSED_HERE = frozenset(
    {
        "PredictFactory",
        "PredictModule",
        "BatchingMetadata",
        "QualNameMetadata",
        "quantize_dense",
        "set_pruning_data",
        "get_table_to_weights_from_tbe",
        "assign_weights_to_tbe",
        "DEFAULT_SHARDERS",
    }
)


def __getattr__(name: str) -> object:
    """TorchRec's torch.deploy serving interfaces and TBE weight helpers: refused by name."""
    if name in _REFUSED_HERE:
        raise refused(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
