"""Tensor-level kernels shared by the sparse types, written on FBGEMM operators (no Python loop over rows).

The types in this package keep the bookkeeping (keys, strides, caches); the functions here only move
tensors, so they run unchanged on CPU and CUDA and never synchronise with the host.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (importing registers torch.ops.fbgemm.*)
import torch
from torch import Tensor


def lengths_to_offsets(lengths: Tensor) -> Tensor:
    """Offsets [0, l0, l0+l1, ...] (len(lengths) + 1 entries, same dtype) of a lengths tensor."""
    if lengths.dtype not in (torch.int32, torch.int64):
        lengths = lengths.to(torch.int64)
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def offsets_to_lengths(offsets: Tensor) -> Tensor:
    """Lengths (len(offsets) - 1 entries) of an offsets tensor."""
    return offsets.diff()


def segment_offsets(sizes: list[int], device: torch.device) -> Tensor:
    """int64 offsets of consecutive segments of the given host-side sizes, on ``device``."""
    return lengths_to_offsets(torch.tensor(sizes, dtype=torch.int64, device=device))


def sum_per_segment(offsets: Tensor, segment_bounds: Tensor) -> Tensor:
    """Total length of each segment of rows, given row offsets and the segments' row bounds (no sync).

    With key-major lengths, ``segment_bounds`` = offsets of the per-key strides gives length_per_key.
    """
    return offsets.to(torch.int64)[segment_bounds].diff()


def permute_segments(
    permute: Tensor,
    stride_per_key: Tensor,
    lengths: Tensor,
    length_per_key: Tensor,
    values: Tensor,
    weights: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Reorder key-major (lengths, values, weights) so that key ``permute[i]`` becomes key ``i``.

    ``permute`` may repeat or omit keys. Works for a variable stride per key: the lengths are permuted as
    segments of ``stride_per_key`` rows, the values as segments of ``length_per_key`` elements.
    """
    permute = permute.to(torch.int32)
    _, permuted_lengths, _ = torch.ops.fbgemm.permute_1D_sparse_data(
        permute, stride_per_key.to(lengths.dtype), lengths, None, None
    )
    _, permuted_values, permuted_weights = torch.ops.fbgemm.permute_1D_sparse_data(
        permute, length_per_key.to(torch.int64), values, weights, None
    )
    return permuted_lengths, permuted_values, permuted_weights


def to_padded_dense(values: Tensor, offsets: Tensor, max_length: int, padding_value: float) -> Tensor:
    """[B, max_length, *values.shape[1:]] dense tensor of jagged rows, truncated or padded to max_length."""
    return torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [max_length], padding_value)


def dense_mask(lengths: Tensor, width: int) -> Tensor:
    """[B, width] boolean mask that is True at the first lengths[b] positions of row b."""
    positions = torch.arange(width, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(-1)


def select_inverse_indices(
    inv: tuple[list[str], Tensor] | None, keys: list[str]
) -> tuple[list[str], Tensor] | None:
    """The rows of ``inv`` for ``keys``, or None when ``inv`` is None or lacks one of them."""
    if inv is None:
        return None
    position = {k: i for i, k in enumerate(inv[0])}
    if any(k not in position for k in keys):
        return None
    rows = torch.tensor([position[k] for k in keys], dtype=torch.int64, device=inv[1].device)
    return keys, inv[1].index_select(0, rows)
