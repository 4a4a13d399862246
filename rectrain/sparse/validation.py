"""Explicit checks of the sparse types, and the debug switch that runs them on every construction.

The constructors are cheap and permissive, as TorchRec's are: they store what they are given and never read
tensor data (so they trace, compile and script). Checking happens where data enters: dataset readers and
the server call ``validate()``, and ``debug_checks()`` (or ``RECTRAIN_SPARSE_CHECKS=1`` in the environment)
makes every constructor validate, to find where a malformed batch was built.

Messages start with the phrase TorchRec's validator uses and go on to name the argument and the numbers.
The tensor-valued checks gather their statistics into one tensor, so a check costs one device-to-host copy.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_TRUE = ("1", "true", "yes", "on")

_checks = contextvars.ContextVar(
    "rectrain_sparse_checks", default=os.environ.get("RECTRAIN_SPARSE_CHECKS", "").lower() in _TRUE
)


@contextlib.contextmanager
def debug_checks(enabled: bool = True) -> Iterator[None]:
    """Within the block, every JaggedTensor/KeyedJaggedTensor/KeyedTensor constructor validates its input.

    Costs a host sync per construction; for debugging. Set ``RECTRAIN_SPARSE_CHECKS=1`` to turn it on
    for a whole process (the context manager overrides it either way).
    """
    token = _checks.set(enabled)
    try:
        yield
    finally:
        _checks.reset(token)


def checks_enabled() -> bool:
    """Whether constructors validate (``debug_checks`` or ``RECTRAIN_SPARSE_CHECKS``)."""
    return _checks.get()


def check_integer(tensor: Tensor | None, name: str) -> None:
    """AssertionError (as TorchRec's constructors raise) unless ``tensor`` is None, empty or integer."""
    if isinstance(tensor, Tensor) and tensor.dtype not in _INTEGER_DTYPES and tensor.numel() != 0:
        raise AssertionError(f"{name} must be of integer type, but got {tensor.dtype}")


def check_keys_unique(keys: Sequence[str], arg: str = "keys") -> None:
    """ValueError if ``keys`` holds a duplicate (lookups by key would be ambiguous)."""
    seen: set[str] = set()
    duplicates = [k for k in keys if k in seen or seen.add(k)]
    if duplicates:
        raise ValueError(
            f"{arg} must be unique but {sorted(set(duplicates))} appear more than once in {list(keys)}"
        )


def check_1d(tensor: Tensor | None, arg: str) -> None:
    """ValueError unless ``tensor`` is None or one-dimensional."""
    if tensor is not None and tensor.dim() != 1:
        raise ValueError(f"{arg} must be 1-D but has shape {tuple(tensor.shape)}")


def check_weights(values: Tensor, weights: Tensor | None) -> None:
    """ValueError unless ``weights`` is None or holds one weight per value (per row of 2-D values)."""
    if weights is not None and (weights.dim() == 0 or weights.size(0) != values.size(0)):
        raise ValueError(
            f"weights size must equal to values size (one weight per value): weights has "
            f"{weights.size(0) if weights.dim() else 0} elements but values has {values.size(0)}"
        )


def check_jagged(values: Tensor, lengths: Tensor | None, offsets: Tensor | None, owner: str) -> None:
    """ValueError unless ``lengths``/``offsets`` partition the first dimension of ``values`` exactly.

    Checks: at least one given, integer and 1-D; lengths non-negative and summing to len(values); offsets
    starting at 0, non-decreasing and ending at len(values); lengths == diff(offsets) when both are given.
    """
    if lengths is None and offsets is None:
        raise ValueError(f"lengths and offsets cannot be both empty: {owner} needs lengths or offsets")
    for name, tensor in (("lengths", lengths), ("offsets", offsets)):
        check_1d(tensor, name)
        if tensor is not None and tensor.dtype not in _INTEGER_DTYPES and tensor.numel():
            raise ValueError(f"{name} must be of integer type, but got {tensor.dtype}")
    if offsets is not None and offsets.numel() == 0:
        raise ValueError("offsets cannot be empty: offsets must have at least one element (offsets[0] == 0)")
    if lengths is not None and offsets is not None and offsets.numel() != lengths.numel() + 1:
        raise ValueError(
            f"Expected lengths size to be 1 more than offsets size: offsets must have len(lengths) + 1 "
            f"elements, but offsets has {offsets.numel()} and lengths has {lengths.numel()}"
        )
    stats = _jagged_stats(lengths, offsets)
    host = dict(zip(stats.keys(), torch.stack(list(stats.values())).tolist()))
    _raise_on_bad_stats(host, values.size(0) if values.dim() else 0)


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
        raise ValueError(
            f"Sum of lengths must equal the number of values: lengths sum to {host['lengths_sum']} "
            f"but values has {num_values} elements"
        )
    if "offsets_first" in host:
        if host["offsets_first"] != 0:
            raise ValueError(
                f"Expected first offset to be 0: offsets must start at 0 but offsets[0] is "
                f"{host['offsets_first']}"
            )
        if host["offsets_decreasing"] > 0:
            raise ValueError(
                f"offsets must be non-decreasing but decrease at {host['offsets_decreasing']} positions"
            )
        if host["offsets_last"] != num_values:
            raise ValueError(
                f"The last element of offsets must equal to the number of values: offsets end at "
                f"{host['offsets_last']} but values has {num_values} elements"
            )
    if host.get("mismatch", 0) > 0:
        raise ValueError(
            f"offsets is not equal to the cumulative sum of lengths: lengths and offsets disagree at "
            f"{host['mismatch']} positions (lengths != diff(offsets))"
        )


def check_num_rows(
    num_rows: int, num_keys: int, stride: int | None, stride_per_key: list[int] | None
) -> None:
    """ValueError unless ``num_rows`` key-major rows fit the number of keys and the (per-key) strides."""
    if stride_per_key is not None:
        if len(stride_per_key) != num_keys:
            raise ValueError(
                f"stride_per_key_per_rank must have one entry per key: got {len(stride_per_key)} for "
                f"{num_keys} keys"
            )
        if min(stride_per_key, default=0) < 0:
            raise ValueError(
                f"stride_per_key_per_rank must be non-negative, got per-key strides {stride_per_key}"
            )
        if sum(stride_per_key) != num_rows:
            raise ValueError(
                f"number of lengths ({num_rows}) must equal the sum of the per-key strides "
                f"{stride_per_key} = {sum(stride_per_key)}"
            )
        return
    if num_keys == 0:
        if num_rows != 0:
            raise ValueError(f"keys is empty but lengths or offsets is not: lengths has {num_rows} elements")
        return
    if stride is not None:
        if stride < 0:
            raise ValueError(f"stride must be non-negative, got {stride}")
        if stride * num_keys != num_rows:
            raise ValueError(
                f"number of lengths ({num_rows}) must equal stride * number of keys = {stride} * {num_keys}"
            )
    elif num_rows % num_keys != 0:
        raise ValueError(
            f"lengths size must be divisible by keys size: number of lengths ({num_rows}) is not divisible "
            f"by the number of keys ({num_keys})"
        )


def validate_jagged_tensor(jt) -> None:
    """ValueError naming the problem unless ``jt``'s lengths/offsets partition its values exactly."""
    values = jt.values()
    check_weights(values, jt.weights_or_none())
    check_jagged(values, jt.lengths_or_none(), jt.offsets_or_none(), "JaggedTensor")


def validate_keyed_jagged_tensor(kjt) -> None:
    """ValueError naming the problem unless ``kjt`` is well formed: unique keys, one weight per value,
    lengths/offsets partitioning the values, rows matching the keys and (per-key) strides, caches
    (length_per_key, offset_per_key) and inverse_indices consistent with them."""
    keys, values = kjt.keys(), kjt.values()
    check_keys_unique(keys)
    check_weights(values, kjt.weights_or_none())
    lengths, offsets = kjt.lengths_or_none(), kjt.offsets_or_none()
    check_jagged(values, lengths, offsets, "KeyedJaggedTensor")
    num_rows = lengths.numel() if lengths is not None else offsets.numel() - 1
    check_num_rows(num_rows, len(keys), kjt._stride, _per_key_strides(kjt))
    _check_per_key_caches(kjt, values.size(0) if values.dim() else 0)
    inverse = kjt.inverse_indices_or_none()
    if inverse is not None:
        inv_keys, inv = inverse
        if inv.dim() != 2 or inv.size(0) != len(inv_keys):
            raise ValueError(
                f"inverse_indices tensor must be [num_keys, batch] with {len(inv_keys)} rows, "
                f"got shape {tuple(inv.shape)}"
            )


def _per_key_strides(kjt) -> list[int] | None:
    """Rows of each key for a variable-batch KJT (None for a fixed stride)."""
    per_rank = kjt._stride_per_key_per_rank
    if not kjt.variable_stride_per_key() or per_rank is None:
        return None
    if per_rank.dim() != 2:
        raise ValueError(
            f"stride_per_key_per_rank must be 2-D [keys, ranks], got shape {tuple(per_rank.shape)}"
        )
    return per_rank.sum(dim=1).tolist()


def _check_per_key_caches(kjt, num_values: int) -> None:
    num_keys = len(kjt.keys())
    lpk, opk = kjt.length_per_key_or_none(), kjt.offset_per_key_or_none()
    if lpk is not None and (len(lpk) != num_keys or sum(lpk) != num_values):
        raise ValueError(
            f"length_per_key {lpk} must have {num_keys} entries summing to len(values) = {num_values}"
        )
    if opk is not None and (len(opk) != num_keys + 1 or opk[0] != 0 or opk[-1] != num_values):
        raise ValueError(
            f"offset_per_key {opk} must have {num_keys + 1} entries from 0 to len(values) = {num_values}"
        )


def validate_keyed_tensor(kt) -> None:
    """ValueError unless ``kt``'s keys are unique and its ``length_per_key`` tiles ``values`` on key_dim."""
    keys, length_per_key, values, key_dim = kt.keys(), kt.length_per_key(), kt.values(), kt.key_dim()
    check_keys_unique(keys)
    if not -values.dim() <= key_dim < values.dim():
        raise ValueError(f"key_dim {key_dim} is out of range for values of shape {tuple(values.shape)}")
    if len(length_per_key) != len(keys):
        raise ValueError(f"length_per_key has {len(length_per_key)} entries for {len(keys)} keys")
    if any(n < 0 for n in length_per_key):
        raise ValueError(f"length_per_key must be non-negative, got {length_per_key}")
    if sum(length_per_key) != values.size(key_dim):
        raise ValueError(
            f"length_per_key sums to {sum(length_per_key)} but values has {values.size(key_dim)} "
            f"entries along key_dim {key_dim}"
        )


def construction_checks(owner, validate: bool | None) -> None:
    """What a constructor checks outside TorchScript: with ``validate=None``, TorchRec's integer-dtype
    assertion on lengths and offsets (and ``validate()`` under ``debug_checks``); with True, also
    ``validate()``; with False, nothing. Nothing runs while a PT2 tracer traces (it would read data)."""
    if validate is False or torch.compiler.is_compiling():
        return
    check_integer(owner.lengths_or_none(), "lengths")
    check_integer(owner.offsets_or_none(), "offsets")
    if validate or _checks.get():
        owner.validate()


def construction_checks_dense(owner, validate: bool | None) -> None:
    """``construction_checks`` for a KeyedTensor (no lengths or offsets to check the dtype of)."""
    if validate is not False and not torch.compiler.is_compiling() and (validate or _checks.get()):
        owner.validate()
