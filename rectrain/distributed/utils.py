"""``torchrec.distributed.utils`` at rectrain's path: ``none_throws``, the fused-params helpers (the engine's,
``parallel/fused_params``), bucket metadata (``interfaces/bucketize``), ``get_unsharded_module_names`` and
TorchRec's weight-conversion helpers.

``EmbeddingQuantizationUtils`` (TorchRec converts a training model's TBE weights in place and back) is
refused by name: rectrain quantizes at export (``recserve export``) or with ``inference.quantize_embeddings``.
"""

from typing import Any, TypeVar

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from torch import nn

from rectrain.distributed.interfaces.bucketize import get_bucket_metadata_from_shard_metadata
from rectrain.distributed.interfaces.sharded_module import ShardedModule
from rectrain.distributed.parallel.fused_params import (
    add_params_from_parameter_sharding,
    convert_to_fbgemm_types,
    merge_fused_params,
)
from rectrain.errors import ConfigError

_T = TypeVar("_T")


def none_throws(optional: _T | None, message: str = "Unexpected `None`") -> _T:
    """``optional``, or an ``AssertionError`` with ``message`` when it is None."""
    if optional is None:
        raise AssertionError(message)
    return optional


def get_unsharded_module_names(model: nn.Module) -> list[str]:
    """Paths of the modules beside sharded ones that hold no sharded module (what DMP replicates)."""
    found = [m.sharded_modules().values() for m in model.modules() if hasattr(m, "sharded_modules")]
    engine = {id(module) for modules in found for module in modules}

    def walk(module: nn.Module, path: str, out: set[str]) -> bool:
        children = dict(module.named_children())
        sharded = {
            n for n, c in children.items()
            if isinstance(c, ShardedModule) or id(c) in engine or walk(c, f"{path}{n}.", out)
        }  # fmt: skip
        out.update(f"{path}{n}" for n in children if sharded and n not in sharded)
        return bool(sharded)

    names: set[str] = set()
    walk(model, "", names)
    return list(names)


def _convert_weights(
    weights: torch.Tensor, converted_dtype: Any, use_cpu_turnaround_optimization: bool = False
) -> torch.Tensor:
    """``weights`` in ``converted_dtype`` (a ``SparseType``), the old storage freed unless it is UVM."""
    converted = weights.to(dtype=converted_dtype.as_dtype())
    if not torch.ops.fbgemm.is_uvm_tensor(weights):
        weights.untyped_storage().resize_(0)
    return converted


def weights_bytes_in_emb_kernel(emb: nn.Module) -> int:
    return sum(t.element_size() * t.numel() for t in (emb.weights_dev, emb.weights_host, emb.weights_uvm))


def data_type_to_sparse_type(data_type: Any) -> SparseType:
    return SparseType(data_type.value.lower())


class EmbeddingQuantizationUtils:
    def __init__(self) -> None:
        raise ConfigError(
            "EmbeddingQuantizationUtils (in-place conversion of a training model's kernel weights) is not "
            "supported by rectrain; quantize for serving with rectrain.inference.modules.quantize_embeddings"
        )


__all__ = [
    "EmbeddingQuantizationUtils",
    "add_params_from_parameter_sharding",
    "convert_to_fbgemm_types",
    "get_bucket_metadata_from_shard_metadata",
    "get_unsharded_module_names",
    "merge_fused_params",
    "none_throws",
    "weights_bytes_in_emb_kernel",
]
