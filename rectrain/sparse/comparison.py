"""Equality of sparse values, for tests and assertions (TorchRec has the same module-level helpers)."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.sparse.jagged_tensor import JaggedTensor
from rectrain.sparse.keyed_jagged_tensor import KeyedJaggedTensor


def jt_is_equal(jt_1: JaggedTensor, jt_2: JaggedTensor) -> bool:
    """True if both have the same rows (lengths and values) and the same weights (or both none)."""
    if not isinstance(jt_1, JaggedTensor) or not isinstance(jt_2, JaggedTensor):
        return False
    return (
        _tensors_equal(jt_1.lengths(), jt_2.lengths())
        and _tensors_equal(jt_1.values(), jt_2.values())
        and _optional_tensors_equal(jt_1.weights_or_none(), jt_2.weights_or_none())
    )


def _tensors_equal(a: Tensor, b: Tensor) -> bool:
    """Shape and element equality, ignoring the integer width (int32 lengths equal int64 lengths)."""
    if a.shape != b.shape:
        return False
    if a.dtype != b.dtype and (a.is_floating_point() or b.is_floating_point()):
        return False
    return bool(torch.equal(a.to(b.dtype) if a.dtype != b.dtype else a, b))


def _optional_tensors_equal(a: Tensor | None, b: Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return _tensors_equal(a, b)


def kjt_is_equal(kjt_1: KeyedJaggedTensor, kjt_2: KeyedJaggedTensor) -> bool:
    """True if both have the same keys, per-key strides, lengths, values and weights (or both none)."""
    if not isinstance(kjt_1, KeyedJaggedTensor) or not isinstance(kjt_2, KeyedJaggedTensor):
        return False
    return (
        kjt_1.keys() == kjt_2.keys()
        and kjt_1.stride_per_key() == kjt_2.stride_per_key()
        and _tensors_equal(kjt_1.lengths(), kjt_2.lengths())
        and _tensors_equal(kjt_1.values(), kjt_2.values())
        and _optional_tensors_equal(kjt_1.weights_or_none(), kjt_2.weights_or_none())
    )
