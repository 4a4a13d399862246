"""Equality of sparse values for tests and assertions (TorchRec's ``jt_is_equal``/``kjt_is_equal``).

As TorchRec's: two (K)JTs are equal when their values are close, and their lengths, offsets (each computed
from the other where missing), weights, per-key sizes and stride agree; an optional part present on one
side only makes them unequal. Integer tensors of different widths (int32 vs int64 lengths) compare by value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rectrain.sparse.jagged import JaggedTensor
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor


def _close(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape:
        return False
    if a.is_floating_point() or b.is_floating_point():
        return a.dtype == b.dtype and bool(torch.allclose(a, b))
    return bool(torch.equal(a.to(torch.int64), b.to(torch.int64)))


def _same(a: Any, b: Any) -> bool:
    """Both None, or both present and equal (tensors by ``_close``)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return _close(a, b)
    return a == b


def _fill_lengths_and_offsets(jt: JaggedTensor | KeyedJaggedTensor) -> None:
    """Compute whichever of lengths/offsets is missing, so that two equal objects built differently match."""
    if jt.offsets_or_none() is not None and jt.lengths_or_none() is None:
        jt.lengths()
    elif jt.lengths_or_none() is not None and jt.offsets_or_none() is None:
        jt.offsets()


@torch.fx.wrap
def jt_is_equal(jt_1: JaggedTensor, jt_2: JaggedTensor) -> bool:
    """True if both JaggedTensors hold the same rows (values close) and the same weights (or none)."""
    if not isinstance(jt_1, JaggedTensor) or not isinstance(jt_2, JaggedTensor):
        return False
    if not _close(jt_1.values(), jt_2.values()):
        return False
    _fill_lengths_and_offsets(jt_1)
    _fill_lengths_and_offsets(jt_2)
    return (
        _same(jt_1.weights_or_none(), jt_2.weights_or_none())
        and _same(jt_1.lengths_or_none(), jt_2.lengths_or_none())
        and _same(jt_1.offsets_or_none(), jt_2.offsets_or_none())
    )


@torch.fx.wrap
def kjt_is_equal(kjt_1: KeyedJaggedTensor, kjt_2: KeyedJaggedTensor) -> bool:
    """True if both have the same keys (in order), values, lengths, offsets, weights, per-key sizes and
    stride."""
    if not isinstance(kjt_1, KeyedJaggedTensor) or not isinstance(kjt_2, KeyedJaggedTensor):
        return False
    if kjt_1.keys() != kjt_2.keys() or not _close(kjt_1.values(), kjt_2.values()):
        return False
    _fill_lengths_and_offsets(kjt_1)
    _fill_lengths_and_offsets(kjt_2)
    kjt_1.sync()
    kjt_2.sync()
    pairs = [
        (kjt_1.lengths_or_none(), kjt_2.lengths_or_none()),
        (kjt_1.weights_or_none(), kjt_2.weights_or_none()),
        (kjt_1.offsets_or_none(), kjt_2.offsets_or_none()),
        (kjt_1.length_per_key_or_none(), kjt_2.length_per_key_or_none()),
        (kjt_1.offset_per_key_or_none(), kjt_2.offset_per_key_or_none()),
        (kjt_1.stride_per_key(), kjt_2.stride_per_key()),
        (kjt_1.stride(), kjt_2.stride()),
    ]
    return all(_same(a, b) for a, b in pairs)
