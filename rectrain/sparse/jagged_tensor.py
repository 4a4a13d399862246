"""TorchRec's module path: ``torchrec.sparse.jagged_tensor`` becomes ``rectrain.sparse.jagged_tensor``.

Every public name of TorchRec's module (and the private helpers its tests import) is here; the
implementations live in the modules of ``rectrain.sparse``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.sparse.comparison import jt_is_equal, kjt_is_equal
from rectrain.sparse.conversions import ComputeJTDictToKJT, ComputeKJTToJTDict
from rectrain.sparse.jagged import JaggedTensor, JaggedTensorMeta
from rectrain.sparse.jagged_ops import cumsum as _cumsum
from rectrain.sparse.jagged_ops import to_offsets as _to_offsets
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor
from rectrain.sparse.keyed_tensor import (
    KeyedTensor,
    _all_keys_used_once,
    _desugar_keyed_tensors,
    _fbgemm_permute_pooled_embs,
    _kt_regroup_arguments,
    _regroup_keyed_tensors,
    _remap_to_groups,
    permute_multi_embedding,
    regroup_kts,
)
from rectrain.sparse.pt2 import is_non_strict_exporting, is_pt2_compiling, is_torchdynamo_compiling
from rectrain.sparse.pytree import _kjt_flatten, _kjt_unflatten

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensor",
    "JaggedTensorMeta",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "flatten_kjt_list",
    "jt_is_equal",
    "kjt_is_equal",
    "permute_multi_embedding",
    "regroup_kts",
    "unflatten_kjt_list",
    "_all_keys_used_once",
    "_cumsum",
    "_desugar_keyed_tensors",
    "_fbgemm_permute_pooled_embs",
    "_kt_regroup_arguments",
    "_regroup_keyed_tensors",
    "_remap_to_groups",
    "_to_offsets",
    "is_non_strict_exporting",
    "is_torchdynamo_compiling",
]

_KJT_LEAVES = 6


def flatten_kjt_list(kjts: list[KeyedJaggedTensor]) -> tuple[list[Tensor | None], list[list[str]]]:
    """The pytree leaves of several KJTs, back to back, and each one's keys."""
    leaves: list[Tensor | None] = []
    contexts: list[list[str]] = []
    for kjt in kjts:
        kjt_leaves, keys = _kjt_flatten(kjt)
        leaves.extend(kjt_leaves)
        contexts.append(keys)
    return leaves, contexts


def unflatten_kjt_list(leaves: list[Tensor | None], contexts: list[list[str]]) -> list[KeyedJaggedTensor]:
    """Inverse of ``flatten_kjt_list``."""
    return [
        _kjt_unflatten(leaves[i * _KJT_LEAVES : (i + 1) * _KJT_LEAVES], contexts[i])
        for i in range(len(leaves) // _KJT_LEAVES)
    ]


@torch.jit.unused
def _cuda_to_cpu_safe(tensor: Tensor) -> Tensor:
    """A host copy of a CUDA tensor that waits on the current stream only (not the whole device)."""
    source = tensor.contiguous()
    host = torch.empty(source.shape, dtype=source.dtype, device="cpu")
    host.copy_(source, non_blocking=True)
    torch.cuda.current_stream(source.device).synchronize()
    return host


def _safe_tolist(tensor: Tensor) -> list[int]:
    """``tensor.tolist()``, copying a CUDA tensor to the host on the current stream only; under PT2
    tracing (fake tensors, whatever device they claim) a plain ``tolist``."""
    if torch.jit.is_scripting() or not tensor.is_cuda or tensor.numel() == 0 or is_pt2_compiling():
        return tensor.tolist()
    return _cuda_to_cpu_safe(tensor).tolist()
