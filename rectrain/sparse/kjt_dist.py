"""TorchRec's KJT distribution helpers: the tensors an all-to-all of a KJT sends, and the parts of the KJT
rebuilt from what it received (``dist_labels``/``dist_splits``/``dist_tensors``/``dist_init``).

Our own input distribution (``rectrain.distributed``) does not need them; they are here so that code
written against TorchRec's KJT runs (and scripts) unchanged.
"""

from typing import Optional

import torch
from torch import Tensor

from rectrain.sparse import jagged_ops, kjt_layout

# (lengths, values, weights, stride, stride_per_key_per_rank): a KeyedJaggedTensor's constructor arguments.
KJTParts = tuple[Tensor, Tensor, Optional[Tensor], Optional[int], Optional[Tensor]]


def labels(variable: bool, weighted: bool) -> list[str]:
    names = ["lengths", "values"]
    if variable:
        names.append("strides")
    if weighted:
        names.append("weights")
    return names


def splits(
    stride_per_key: list[int],
    length_per_key: list[int],
    key_splits: list[int],
    variable: bool,
    weighted: bool,
) -> list[list[int]]:
    rows_per_split = kjt_layout.sum_by_splits(stride_per_key, key_splits)
    values_per_split = kjt_layout.sum_by_splits(length_per_key, key_splits)
    result = [rows_per_split, values_per_split]
    if variable:
        result.append(key_splits)
    if weighted:
        result.append(values_per_split)
    return result


def tensors(
    lengths: Tensor, values: Tensor, weights: Tensor | None, stride_per_key: list[int] | None
) -> list[Tensor]:
    result = [lengths, values]
    if stride_per_key is not None:
        result.append(torch.tensor(stride_per_key, device=values.device))
    if weights is not None:
        result.append(weights)
    return result


def init(
    keys: list[str],
    received: list[Tensor],
    variable: bool,
    num_workers: int,
    recat: Tensor | None,
    stride_per_rank: list[int] | None,
    stagger: int,
) -> KJTParts:
    """The KJT parts of ``received`` = [lengths, values, (VBE) strides, (weighted) weights], rank-major,
    reordered key-major by ``recat``."""
    if len(received) < 2 or len(received) > 4:
        raise ValueError(
            f"dist_init needs 2 to 4 tensors (lengths, values, strides, weights), got {len(received)}"
        )
    lengths, values = received[0], received[1]
    weights: Tensor | None = None
    if (variable and len(received) == 4) or (not variable and len(received) == 3):
        weights = received[-1]
    if variable:
        return _init_variable(keys, lengths, values, weights, received[2], num_workers, recat, stagger)
    if stride_per_rank is None:
        raise ValueError("dist_init needs stride_per_rank without a variable stride per key")
    if recat is not None and len(stride_per_rank) > 0:
        lengths, values, weights = _recat_fixed(recat, lengths, values, weights, stride_per_rank)
    total = 0
    for s in stride_per_rank:
        total += s
    return lengths, values, weights, total, None


def _recat_fixed(
    recat: Tensor, lengths: Tensor, values: Tensor, weights: Tensor | None, stride_per_rank: list[int]
) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    stride = stride_per_rank[0]
    same = True
    for s in stride_per_rank:
        same = same and s == stride
    if not same:
        out = torch.ops.fbgemm.permute_1D_sparse_data(
            recat, lengths.view(-1), values, weights, values.numel()
        )
        return out[0], out[1], out[2]
    if stride == 0:
        return lengths, values, weights
    out = torch.ops.fbgemm.permute_2D_sparse_data(
        recat, lengths.view(-1, stride), values, weights, values.numel()
    )
    return out[0].view(-1), out[1], out[2]


def _init_variable(
    keys: list[str],
    lengths: Tensor,
    values: Tensor,
    weights: Tensor | None,
    strides: Tensor,
    num_workers: int,
    recat: Tensor | None,
    stagger: int,
) -> KJTParts:
    per_rank = strides.view(num_workers, len(keys)).T.cpu()
    if recat is not None:
        bounds = jagged_ops.to_offsets(strides).cpu()
        ends = jagged_ops.to_offsets(lengths)
        values_per_block = ends[bounds[1:]] - ends[bounds[:-1]]
        lengths, _ = jagged_ops.permute_by_segments(lengths, strides, recat)
        values, weights = jagged_ops.permute_by_segments(values, values_per_block, recat, weights)
    if per_rank.numel() == 0:
        per_rank = torch.zeros((len(keys), 1), dtype=torch.int64)
    if stagger > 1:
        order = torch.arange(num_workers).view(stagger, -1).T.reshape(-1)
        per_rank = per_rank[:, order]
    return lengths, values, weights, None, per_rank
