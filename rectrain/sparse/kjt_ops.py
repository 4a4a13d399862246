"""The KeyedJaggedTensor constructors that combine or mimic other KJTs: concat, empty_like, from_jt_dict.

Functions (TorchScript-compatible) behind the static methods of ``keyed_jagged.py``. ``torch.fx`` treats
concat and empty_like as leaves (see the ``torch.fx.wrap`` calls there): their bodies loop over inputs.
"""

from typing import Optional

import torch
from torch import Tensor

from rectrain.sparse.jagged import JaggedTensor
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor


def _kjt_concat(kjt_list: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    if len(kjt_list) == 0:
        raise ValueError("concat needs at least one KeyedJaggedTensor, got an empty list")
    weighted = kjt_list[0].weights_or_none() is not None
    keys: list[str] = []
    values: list[Tensor] = []
    weights: list[Tensor] = []
    lengths: list[Tensor] = []
    length_per_key: list[int] = []
    has_length_per_key = True
    for kjt in kjt_list:
        part_weights = kjt.weights_or_none()
        if (part_weights is not None) != weighted:
            raise ValueError("cannot concat weighted and unweighted KeyedJaggedTensors")
        keys.extend(kjt.keys())
        values.append(kjt.values())
        lengths.append(kjt.lengths())
        if part_weights is not None:
            weights.append(part_weights)
        part_length_per_key = kjt.length_per_key_or_none()
        if part_length_per_key is None:
            has_length_per_key = False
        else:
            length_per_key.extend(part_length_per_key)
    stride, per_rank = _concat_strides(kjt_list)
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values, dim=0),
        weights=torch.cat(weights, dim=0) if weighted else None,
        lengths=torch.cat(lengths, dim=0),
        stride=stride,
        stride_per_key_per_rank=per_rank,
        length_per_key=length_per_key if has_length_per_key else None,
        inverse_indices=_concat_inverse_indices(kjt_list),
    )


def _concat_strides(kjt_list: list[KeyedJaggedTensor]) -> tuple[Optional[int], Optional[Tensor]]:
    """(stride, None) when every part has the same fixed stride, else (None, per-key-per-rank strides)."""
    variable = False
    strides: list[int] = []
    for kjt in kjt_list:
        variable = variable or kjt.variable_stride_per_key()
        if len(kjt.keys()) > 0:
            strides.append(kjt.stride())
    if not variable:
        same = True
        for s in strides:
            same = same and s == strides[0]
        if same:
            return (strides[0] if len(strides) > 0 else kjt_list[0].stride()), None
    rows: list[Tensor] = []
    for kjt in kjt_list:
        if len(kjt.keys()) == 0:
            continue
        per_rank = kjt._stride_per_key_per_rank
        if kjt.variable_stride_per_key() and per_rank is not None:
            rows.append(per_rank.reshape(len(kjt.keys()), -1).to(torch.int32))
        else:
            rows.append(torch.full((len(kjt.keys()), 1), kjt.stride(), dtype=torch.int32))
    for r in rows:
        if r.size(1) != rows[0].size(1):
            widths = [r.size(1) for r in rows]
            raise ValueError(
                f"cannot concat KeyedJaggedTensors spread over different numbers of ranks {widths}"
            )
    return None, torch.cat(rows, dim=0) if len(rows) > 0 else torch.empty((0, 1), dtype=torch.int32)


def _concat_inverse_indices(kjt_list: list[KeyedJaggedTensor]) -> tuple[list[str], Tensor] | None:
    keys: list[str] = []
    tensors: list[Tensor] = []
    for kjt in kjt_list:
        inverse = kjt.inverse_indices_or_none()
        if inverse is not None:
            keys.extend(inverse[0])
            tensors.append(inverse[1])
    if len(tensors) == 0:
        return None
    if len(tensors) != len(kjt_list):
        raise ValueError("cannot concat KeyedJaggedTensors of which only some have inverse_indices")
    return keys, torch.cat(tensors)


def _kjt_empty_like_stride(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
    weights = kjt.weights_or_none()
    per_rank = kjt._stride_per_key_per_rank
    variable = per_rank is not None and kjt.variable_stride_per_key()
    return KeyedJaggedTensor(
        keys=torch.jit.annotate(list[str], []),
        values=torch.empty(0, device=kjt.device(), dtype=kjt.values().dtype),
        weights=None if weights is None else torch.empty(0, device=kjt.device(), dtype=weights.dtype),
        lengths=torch.empty(0, device=kjt.device(), dtype=kjt.lengths().dtype),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=per_rank if variable else None,
    )


def _kjt_empty_like_device(kjt: KeyedJaggedTensor, device: torch.device) -> KeyedJaggedTensor:
    per_rank = kjt._stride_per_key_per_rank
    variable = per_rank is not None and kjt.variable_stride_per_key()
    inverse = kjt.inverse_indices_or_none()
    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=torch.empty_like(kjt.values(), device=device),
        weights=_empty_like_or_none(kjt.weights_or_none(), device),
        lengths=_empty_like_or_none(kjt.lengths_or_none(), device),
        offsets=_empty_like_or_none(kjt.offsets_or_none(), device),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=per_rank if variable else None,
        stride_per_key=kjt._stride_per_key,
        length_per_key=kjt._length_per_key,
        offset_per_key=kjt._offset_per_key,
        inverse_indices=None
        if inverse is None
        else (inverse[0], torch.empty_like(inverse[1], device=device)),
    )


def _empty_like_or_none(tensor: Tensor | None, device: torch.device) -> Tensor | None:
    return None if tensor is None else torch.empty_like(tensor, device=device)


def _kjt_from_jt_dict(jt_dict: dict[str, JaggedTensor], force_variable_stride: bool) -> KeyedJaggedTensor:
    if len(jt_dict) == 0:
        return KeyedJaggedTensor.empty()
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
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        weights=torch.cat(weights) if len(weights) > 0 else None,
        lengths=torch.cat(lengths),
        stride=None if variable else strides[0],
        stride_per_key_per_rank=torch.tensor(strides, dtype=torch.int32).view(-1, 1) if variable else None,
    )
