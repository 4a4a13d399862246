"""Tensor kernels the sparse types share, on FBGEMM operators (no Python loop over rows).

Every function here is TorchScript-compatible (the sparse types are ``torch.jit.script``-able, as
TorchRec's are) and runs unchanged on CPU, CUDA and meta/fake tensors.
"""

from typing import Optional

import fbgemm_gpu  # noqa: F401  (importing registers torch.ops.fbgemm.*)
import torch
from torch import Tensor


def cumsum(sizes: list[int]) -> list[int]:
    """[0, s0, s0+s1, ...] of host-side sizes (len(sizes) + 1 entries)."""
    out = [0] * (len(sizes) + 1)
    for i in range(len(sizes)):
        out[i + 1] = out[i] + sizes[i]
    return out


def to_offsets(lengths: Tensor) -> Tensor:
    """Offsets [0, l0, l0+l1, ...] of ``lengths`` (one more entry, same integer dtype)."""
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def lengths_or_computed(lengths: Tensor | None, offsets: Tensor | None) -> Tensor:
    """``lengths``, or ``diff(offsets)`` when only offsets are known."""
    if lengths is None:
        assert offsets is not None, "Must provide lengths or offsets"
        return torch.diff(offsets)
    return lengths


def offsets_or_computed(lengths: Tensor | None, offsets: Tensor | None) -> Tensor:
    """``offsets``, or the cumulative sum of ``lengths`` when only lengths are known."""
    if offsets is None:
        assert lengths is not None, "Must provide lengths or offsets"
        return to_offsets(lengths)
    return offsets


def batched_lengths_to_offsets(lengths: Tensor) -> Tensor:
    """Row-wise offsets of a [F, B] lengths tensor: [F, B + 1], each row starting at 0 (same dtype)."""
    zeros = lengths.new_zeros((lengths.size(0), 1))
    return torch.cat([zeros, torch.cumsum(lengths, dim=-1).to(lengths.dtype)], dim=-1)


def permute_by_segments(
    tensor: Tensor,
    segment_sizes: Tensor,
    order: Tensor,
    weights: Tensor | None = None,
    output_size: int | None = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Concatenate the segments of ``tensor`` (sizes ``segment_sizes``) in ``order``; segments may repeat or
    be left out. ``weights`` (one per element) follow their elements."""
    _, permuted, permuted_weights = torch.ops.fbgemm.permute_1D_sparse_data(
        order, segment_sizes, tensor, weights, output_size
    )
    return permuted, permuted_weights


def to_padded_dense(values: Tensor, offsets: Tensor, max_length: int, padding_value: float) -> Tensor:
    """[B, max_length, *values.shape[1:]] dense tensor of jagged rows, truncated or padded to max_length."""
    return torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [max_length], padding_value)


def sum_per_segment(lengths: Tensor, segment_sizes: list[int]) -> Tensor:
    """Sum of each consecutive segment of ``lengths`` (segments of host-side sizes), as an int64 tensor."""
    if len(segment_sizes) == 0:
        return torch.empty(0, dtype=torch.int64, device=lengths.device)
    bounds = torch.tensor(cumsum(segment_sizes), dtype=torch.int64, device=lengths.device)
    ends = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths.to(torch.int64))
    return ends[bounds].diff()
