"""Construction-time checks for the sparse types, with messages that name the argument and the numbers.

TorchRec does not validate its sparse types; we do by default because a malformed batch otherwise surfaces
much later as an out-of-bounds read inside an FBGEMM kernel. Every check here is vectorised and the
tensor-valued ones share a single device-to-host copy, so the cost is one sync per constructor. Hot paths
that build tensors they already trust pass ``validate=False`` to the constructors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def check_keys_unique(keys: Sequence[str], arg: str = "keys") -> None:
    """Raise ValueError if ``keys`` holds a duplicate (lookups by key would be ambiguous)."""
    seen: set[str] = set()
    duplicates = [k for k in keys if k in seen or seen.add(k)]
    if duplicates:
        raise ValueError(
            f"{arg} must be unique but {sorted(set(duplicates))} appear more than once in {list(keys)}"
        )


def check_1d(tensor: Tensor | None, arg: str) -> None:
    """Raise ValueError unless ``tensor`` is None or one-dimensional."""
    if tensor is not None and tensor.dim() != 1:
        raise ValueError(f"{arg} must be 1-D but has shape {tuple(tensor.shape)}")


def check_weights(values: Tensor, weights: Tensor | None) -> None:
    """Raise ValueError unless ``weights`` is None or holds exactly one weight per value."""
    if weights is not None and weights.size(0) != values.size(0):
        raise ValueError(
            f"weights must have one entry per value: weights has {weights.size(0)} elements "
            f"but values has {values.size(0)}"
        )


def check_num_lengths(
    num_lengths: int, num_keys: int, stride: int | None, stride_per_key: list[int] | None
) -> None:
    """Raise ValueError unless ``num_lengths`` key-major rows fit the number of keys and the strides."""
    if stride_per_key is not None:
        if len(stride_per_key) != num_keys:
            raise ValueError(
                f"stride_per_key_per_rank must have one entry per key: "
                f"got {len(stride_per_key)} for {num_keys} keys"
            )
        if min(stride_per_key, default=0) < 0:
            raise ValueError(
                f"stride_per_key_per_rank must be non-negative, got per-key strides {stride_per_key}"
            )
        if sum(stride_per_key) != num_lengths:
            raise ValueError(
                f"number of lengths ({num_lengths}) must equal the sum of the per-key strides "
                f"{stride_per_key} = {sum(stride_per_key)}"
            )
        return
    if num_keys == 0:
        if num_lengths != 0:
            raise ValueError(f"keys is empty but lengths has {num_lengths} elements")
        return
    if stride is not None:
        if stride < 0:
            raise ValueError(f"stride must be non-negative, got {stride}")
        if stride * num_keys != num_lengths:
            raise ValueError(
                f"number of lengths ({num_lengths}) must equal stride * number of keys "
                f"= {stride} * {num_keys}"
            )
    elif num_lengths % num_keys != 0:
        raise ValueError(
            f"number of lengths ({num_lengths}) is not divisible by the number of keys ({num_keys})"
        )


def check_jagged(values: Tensor, lengths: Tensor | None, offsets: Tensor | None) -> None:
    """Raise ValueError unless ``lengths``/``offsets`` describe a partition of ``values``' first dimension.

    Checks: lengths non-negative and summing to len(values); offsets starting at 0, non-decreasing and ending
    at len(values); and, when both are given, lengths == diff(offsets). All statistics are gathered into one
    tensor and copied to the host once.
    """
    check_1d(lengths, "lengths")
    check_1d(offsets, "offsets")
    if offsets is not None and offsets.numel() == 0:
        raise ValueError("offsets must have at least one element (offsets[0] == 0); got an empty tensor")
    if lengths is not None and offsets is not None and offsets.numel() != lengths.numel() + 1:
        raise ValueError(
            f"offsets must have len(lengths) + 1 elements: "
            f"offsets has {offsets.numel()}, lengths has {lengths.numel()}"
        )
    stats = _jagged_stats(lengths, offsets)
    if not stats:
        return
    host = dict(zip(stats.keys(), torch.stack(list(stats.values())).tolist()))
    _raise_on_bad_stats(host, values.size(0))


def _jagged_stats(lengths: Tensor | None, offsets: Tensor | None) -> dict[str, Tensor]:
    """The per-check statistics, as int64 scalars on the tensors' device (no sync)."""
    stats: dict[str, Tensor] = {}
    if lengths is not None:
        lengths64 = lengths.to(torch.int64)
        stats["lengths_sum"] = lengths64.sum()
        stats["lengths_negative"] = (lengths64 < 0).sum()
        stats["lengths_min"] = torch.cat([lengths64, lengths64.new_zeros(1)]).min()
    if offsets is not None:
        offsets64 = offsets.to(torch.int64)
        steps = offsets64.diff()
        stats["offsets_first"] = offsets64[0]
        stats["offsets_last"] = offsets64[-1]
        stats["offsets_decreasing"] = (steps < 0).sum()
        if lengths is not None:
            stats["mismatch"] = (steps != lengths.to(torch.int64)).sum()
    return stats


def _raise_on_bad_stats(host: dict[str, int], num_values: int) -> None:
    if host.get("lengths_negative", 0) > 0:
        raise ValueError(
            f"lengths must be non-negative but {host['lengths_negative']} entries are negative "
            f"(smallest {host['lengths_min']})"
        )
    if "lengths_sum" in host and host["lengths_sum"] != num_values:
        raise ValueError(f"lengths sum to {host['lengths_sum']} but values has {num_values} elements")
    if "offsets_first" in host:
        if host["offsets_first"] != 0:
            raise ValueError(f"offsets must start at 0 but offsets[0] is {host['offsets_first']}")
        if host["offsets_decreasing"] > 0:
            raise ValueError(
                f"offsets must be non-decreasing but decrease at {host['offsets_decreasing']} positions"
            )
        if host["offsets_last"] != num_values:
            raise ValueError(f"offsets end at {host['offsets_last']} but values has {num_values} elements")
    if host.get("mismatch", 0) > 0:
        raise ValueError(
            f"lengths and offsets disagree at {host['mismatch']} positions (lengths != diff(offsets))"
        )


def check_kjt(
    *,
    keys: list[str],
    values: Tensor,
    weights: Tensor | None,
    lengths: Tensor | None,
    offsets: Tensor | None,
    stride: int | None,
    stride_per_key: list[int] | None,
    length_per_key: list[int] | None,
    offset_per_key: list[int] | None,
    inverse_indices: tuple[list[str], Tensor] | None,
) -> None:
    """All construction checks of a KeyedJaggedTensor (``stride_per_key`` is None unless VBE)."""
    check_keys_unique(keys)
    check_1d(values, "values")
    check_weights(values, weights)
    check_jagged(values, lengths, offsets)
    num_rows = lengths.numel() if lengths is not None else offsets.numel() - 1
    check_num_lengths(num_rows, len(keys), stride, stride_per_key)
    num_keys, num_values = len(keys), values.size(0)
    if length_per_key is not None and (len(length_per_key) != num_keys or sum(length_per_key) != num_values):
        raise ValueError(
            f"length_per_key {length_per_key} must have {num_keys} entries summing to "
            f"len(values) = {num_values}"
        )
    opk = offset_per_key
    if opk is not None and (len(opk) != num_keys + 1 or opk[0] != 0 or opk[-1] != num_values):
        raise ValueError(
            f"offset_per_key {opk} must have {num_keys + 1} entries from 0 to len(values) = {num_values}"
        )
    if inverse_indices is not None:
        inv_keys, inv = inverse_indices
        if inv.dim() != 2 or inv.size(0) != len(inv_keys):
            raise ValueError(
                f"inverse_indices tensor must be [num_keys, batch] with {len(inv_keys)} rows, "
                f"got shape {tuple(inv.shape)}"
            )


def check_all_or_no_weights(keys: list[str], weighted: list[bool]) -> None:
    """Raise ValueError if some parts being combined have weights and others do not."""
    if any(weighted) and not all(weighted):
        raise ValueError(f"cannot combine weighted and unweighted parts (keys {keys}; weighted: {weighted})")
