"""The parts of the KeyedJaggedTensors that combine others: concat's strides and inverse indices, and
from_jt_dict's tensors.

Functions (TorchScript-compatible) on plain tensors and lists; the constructors in ``keyed_jagged.py`` read
their input KJTs, call these and build the result (this module does not know the class).
"""

from typing import Optional

import torch
from torch import Tensor

from rectrain.sparse.jagged import JaggedTensor

InverseIndices = tuple[list[str], Tensor]
# (keys, values, weights, lengths, stride, stride_per_key_per_rank): KeyedJaggedTensor's arguments.
JTDictParts = tuple[list[str], Tensor, Optional[Tensor], Tensor, Optional[int], Optional[Tensor]]
# The same, then length_per_key.
ConcatParts = tuple[
    list[str], Tensor, Optional[Tensor], Tensor, Optional[int], Optional[Tensor], Optional[list[int]]
]


def concat_parts(
    keys: list[list[str]],
    values: list[Tensor],
    weights: list[Optional[Tensor]],
    lengths: list[Tensor],
    length_per_key: list[Optional[list[int]]],
    strides: list[int],
    variable: list[bool],
    per_rank: list[Optional[Tensor]],
) -> ConcatParts:
    """The concatenation of KJTs given by their parts (one list entry per KJT; ``per_rank``: VBE strides)."""
    if len(keys) == 0:
        raise ValueError("concat needs at least one KeyedJaggedTensor, got an empty list")
    weighted = weights[0] is not None
    all_keys: list[str] = []
    present: list[Tensor] = []
    all_length_per_key: list[int] = []
    has_length_per_key = True
    for i in range(len(keys)):
        part_weights = weights[i]
        if (part_weights is not None) != weighted:
            raise ValueError("cannot concat weighted and unweighted KeyedJaggedTensors")
        all_keys.extend(keys[i])
        if part_weights is not None:
            present.append(part_weights)
        part_length_per_key = length_per_key[i]
        if part_length_per_key is None:
            has_length_per_key = False
        else:
            all_length_per_key.extend(part_length_per_key)
    stride, stride_per_key_per_rank = _concat_strides(keys, strides, variable, per_rank)
    return (
        all_keys,
        torch.cat(values, dim=0),
        torch.cat(present, dim=0) if weighted else None,
        torch.cat(lengths, dim=0),
        stride,
        stride_per_key_per_rank,
        all_length_per_key if has_length_per_key else None,
    )


def _concat_strides(
    keys: list[list[str]], strides: list[int], variable: list[bool], per_rank: list[Optional[Tensor]]
) -> tuple[Optional[int], Optional[Tensor]]:
    """(stride, None) when every part with keys has the same fixed stride, else (None, per-key-per-rank
    strides)."""
    any_variable = False
    with_keys: list[int] = []
    for i in range(len(keys)):
        any_variable = any_variable or variable[i]
        if len(keys[i]) > 0:
            with_keys.append(i)
    if not any_variable:
        same = True
        for i in with_keys:
            same = same and strides[i] == strides[with_keys[0]]
        if same:
            return (strides[with_keys[0]] if len(with_keys) > 0 else strides[0]), None
    rows: list[Tensor] = []
    for i in with_keys:
        part = per_rank[i]
        if variable[i] and part is not None:
            rows.append(part.reshape(len(keys[i]), -1).to(torch.int32))
        else:
            rows.append(torch.full((len(keys[i]), 1), strides[i], dtype=torch.int32))
    for r in rows:
        if r.size(1) != rows[0].size(1):
            widths = [r.size(1) for r in rows]
            raise ValueError(
                f"cannot concat KeyedJaggedTensors spread over different numbers of ranks {widths}"
            )
    return None, torch.cat(rows, dim=0) if len(rows) > 0 else torch.empty((0, 1), dtype=torch.int32)


def concat_inverse_indices(inverses: list[Optional[InverseIndices]]) -> Optional[InverseIndices]:
    keys: list[str] = []
    tensors: list[Tensor] = []
    for inverse in inverses:
        if inverse is not None:
            keys.extend(inverse[0])
            tensors.append(inverse[1])
    if len(tensors) == 0:
        return None
    if len(tensors) != len(inverses):
        raise ValueError("cannot concat KeyedJaggedTensors of which only some have inverse_indices")
    return keys, torch.cat(tensors)


def empty_like_or_none(tensor: Optional[Tensor], device: torch.device) -> Optional[Tensor]:
    return None if tensor is None else torch.empty_like(tensor, device=device)


def from_jt_dict_parts(jt_dict: dict[str, JaggedTensor], force_variable_stride: bool) -> JTDictParts:
    """The stacked tensors of non-empty ``jt_dict``."""
    keys = list(jt_dict.keys())
    values: list[Tensor] = []
    lengths: list[Tensor] = []
    weights: list[Tensor] = []
    strides: list[int] = []
    for jt in jt_dict.values():
        strides.append(jt.lengths().numel())
        values.append(jt.values())
        lengths.append(jt.lengths())
        jt_weights = jt.weights_or_none()
        if jt_weights is not None:
            weights.append(jt_weights)
    if len(weights) != 0 and len(weights) != len(keys):
        raise ValueError(
            f"cannot build a KeyedJaggedTensor from JaggedTensors of which only some are weighted {keys}"
        )
    variable = force_variable_stride
    for s in strides:
        variable = variable or s != strides[0]
    return (
        keys,
        torch.cat(values),
        torch.cat(weights) if len(weights) > 0 else None,
        torch.cat(lengths),
        None if variable else strides[0],
        torch.tensor(strides, dtype=torch.int32).view(-1, 1) if variable else None,
    )
