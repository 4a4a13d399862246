"""The bookkeeping of a KeyedJaggedTensor's key-major layout, as TorchScript-compatible functions.

``lengths`` holds key 0's rows, then key 1's, ...; ``values`` the ids in the same order. These functions
derive what the type caches (stride, rows and values per key, per-key slices of a dict view) from the
tensors, with the same rules as TorchRec: a stride given wins; a variable batch per key (VBE) takes its
strides from ``stride_per_key_per_rank`` ([keys, ranks] int tensor); values past the last row are ignored.
"""

from typing import Optional

import torch
from torch import Tensor

from rectrain.sparse import jagged_ops, pt2
from rectrain.sparse.jagged import JaggedTensor


def stride_of(
    keys: list[str],
    stride: int | None,
    lengths: Tensor | None,
    offsets: Tensor | None,
    stride_per_key_per_rank: Tensor | None,
    inverse_indices: tuple[list[str], Tensor] | None,
) -> int:
    """The batch size: given, else (VBE) the inverse indices' width or the largest per-key stride, else
    rows / keys."""
    if stride is not None:
        return stride
    if len(keys) == 0:
        return 0
    if stride_per_key_per_rank is not None and stride_per_key_per_rank.numel() > 0:
        if inverse_indices is not None and inverse_indices[1].numel() > 0:
            return inverse_indices[1].shape[-1]
        return int(stride_per_key_per_rank.sum(dim=1).max().item())
    if offsets is not None and offsets.numel() > 0:
        return (offsets.numel() - 1) // len(keys)
    if lengths is not None:
        return lengths.numel() // len(keys)
    return 0


def stride_per_key_of(
    stride_per_key_per_rank: Tensor | None, stride: int, keys: list[str], variable: bool
) -> list[int]:
    """Rows of each key: summed over ranks with VBE, else ``stride`` for every key."""
    if variable and stride_per_key_per_rank is not None:
        if stride_per_key_per_rank.dim() != 2:
            return []  # a permute to no keys leaves an empty tensor
        per_key: list[int] = stride_per_key_per_rank.sum(dim=1).tolist()
        return per_key
    return [stride] * len(keys)


def length_per_key_of(
    keys: list[str],
    stride: int,
    stride_per_key: list[int],
    variable: bool,
    lengths: Tensor | None,
    offsets: Tensor | None,
    values: Tensor,
) -> list[int]:
    """Values of each key (one host sync). Meta tensors hold no data: their values are split evenly."""
    if len(keys) == 0:
        return []
    if values.is_meta:
        total = values.size(0) if values.dim() > 0 else 0
        per_key = [total // len(keys)] * len(keys)
        per_key[0] += total % len(keys)
        return per_key
    if lengths is None:
        if offsets is None or offsets.numel() == 0:
            return [0] * len(keys)  # no rows
        lengths = torch.diff(offsets)
    if variable:
        result: list[int] = jagged_ops.sum_per_segment(lengths, stride_per_key).tolist()
    elif lengths.numel() == 0:
        result = [0] * len(keys)
    else:
        result = torch.jit.annotate(list[int], torch.sum(lengths.view(len(keys), stride), dim=1).tolist())
    if not torch.jit.is_scripting():
        pt2.check_sizes(result)
    return result


def check_slice(tensor: Tensor, start: int, end: int) -> None:
    """Under PT2 tracing, tell the tracer that ``tensor[start:end]`` is in bounds (data-dependent ints)."""
    if not torch.jit.is_scripting() and pt2.is_pt2_compiling():
        torch._check(start >= 0)
        torch._check(start <= end)
        torch._check(end <= tensor.size(0))


def permuted_tensors(
    indices: Tensor,
    lengths: Tensor,
    values: Tensor,
    weights: Optional[Tensor],
    stride_per_key: list[int],
    length_per_key: list[int],
    variable: bool,
    output_size: int,
) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """(lengths, values, weights) with key ``indices[i]`` moved to position i; keys may repeat or be left
    out. A fixed stride permutes [keys, stride] lengths; a variable one, per-key segments."""
    if variable:
        strides = torch.tensor(stride_per_key, dtype=lengths.dtype, device=lengths.device)
        sizes = torch.tensor(length_per_key, dtype=torch.int64, device=lengths.device)
        permuted_lengths, _ = jagged_ops.permute_by_segments(lengths, strides, indices)
        permuted_values, permuted_weights = jagged_ops.permute_by_segments(values, sizes, indices, weights)
        return permuted_lengths, permuted_values, permuted_weights
    stride = stride_per_key[0]
    if not torch.jit.is_scripting() and pt2.is_torchdynamo_compiling():
        out = torch.ops.fbgemm.permute_2D_sparse_data_input1D(
            indices, lengths, values, stride, weights, output_size
        )
    else:
        out = torch.ops.fbgemm.permute_2D_sparse_data(
            indices, lengths.view(len(stride_per_key), -1), values, weights, output_size
        )
    return out[0].view(-1), out[1], out[2]


def jt_dict_of(
    keys: list[str],
    stride: int,
    stride_per_key: list[int],
    length_per_key: list[int],
    values: Tensor,
    lengths: Tensor,
    weights: Tensor | None,
    variable: bool,
    compute_offsets: bool,
) -> dict[str, JaggedTensor]:
    """One JaggedTensor per key (views into the KJT's tensors)."""
    if len(length_per_key) == 0:
        return {}
    value_bounds = jagged_ops.cumsum(length_per_key)
    if not torch.jit.is_scripting() and pt2.is_pt2_compiling():
        torch._check(value_bounds[-1] <= values.size(0))
    split_lengths, split_offsets = _per_key_lengths(keys, stride, stride_per_key, lengths, variable)
    result: dict[str, JaggedTensor] = {}
    for i, key in enumerate(keys):
        start, end = value_bounds[i], value_bounds[i + 1]
        result[key] = JaggedTensor(
            values=values[start:end],
            weights=None if weights is None else weights[start:end],
            lengths=split_lengths[i],
            offsets=split_offsets[i] if compute_offsets else None,
        )
    return result


def _per_key_lengths(
    keys: list[str], stride: int, stride_per_key: list[int], lengths: Tensor, variable: bool
) -> tuple[list[Tensor], list[Tensor]]:
    """Each key's lengths and (from 0) offsets."""
    if variable:
        split = list(torch.split(lengths, stride_per_key))
        return split, [jagged_ops.to_offsets(part) for part in split]
    if lengths.numel() > 0:
        strided = lengths.view(len(keys), stride)
        return list(torch.unbind(strided, dim=0)), list(
            torch.unbind(jagged_ops.batched_lengths_to_offsets(strided), dim=0)
        )
    empty = list(torch.unbind(lengths.view(len(keys), 0), dim=0))
    return empty, empty


def sum_by_splits(sizes: list[int], splits: list[int]) -> list[int]:
    """Sum of each consecutive group of ``sizes`` (group i holds ``splits[i]`` entries)."""
    out: list[int] = []
    start = 0
    for n in splits:
        total = 0
        for i in range(start, start + n):
            total += sizes[i]
        out.append(total)
        start += n
    return out


def total(sizes: list[int]) -> int:
    result = 0
    for n in sizes:
        result += n
    return result


def moved_tensors(
    tensors: list[Optional[Tensor]],
    inverse_indices: tuple[list[str], Tensor] | None,
    device: torch.device,
    non_blocking: bool,
) -> list[Optional[Tensor]]:
    """``tensors`` (then the inverse indices' tensor, or None) moved to ``device``."""
    moved: list[Optional[Tensor]] = []
    for tensor in tensors:
        moved.append(None if tensor is None else tensor.to(device, non_blocking=non_blocking))
    moved.append(
        None if inverse_indices is None else inverse_indices[1].to(device, non_blocking=non_blocking)
    )
    return moved


def pinned_tensors(tensors: list[Optional[Tensor]]) -> list[Optional[Tensor]]:
    pinned: list[Optional[Tensor]] = []
    for tensor in tensors:
        pinned.append(None if tensor is None else tensor.pin_memory())
    return pinned


def nbytes(tensors: list[Optional[Tensor]]) -> int:
    total = 0
    for tensor in tensors:
        if tensor is not None:
            total += tensor.element_size() * tensor.numel()
    return total


def copy_tensors(
    destinations: list[Optional[Tensor]], sources: list[Optional[Tensor]], non_blocking: bool
) -> None:
    """``destination.copy_(source)`` for each pair where both are present."""
    for destination, source in zip(destinations, sources):
        if destination is not None and source is not None:
            destination.copy_(source, non_blocking=non_blocking)
