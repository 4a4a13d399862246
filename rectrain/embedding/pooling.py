"""MEAN pooling done as SUM followed by a division by the bag lengths.

Two places need it: a row shard only sees part of each bag, so the whole bag's length divides after the
partial sums are added; and FBGEMM 1.8.0's CPU backward of *weighted* MEAN pooling drops the 1/length factor
(the weight update equals the SUM gradient), so weighted MEAN tables run as SUM and are divided here, where
autograd differentiates the division exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def divide_by_bag_lengths(pooled: Tensor, lengths: Tensor, spans: Sequence[tuple[int, int, int]]) -> Tensor:
    """``pooled[:, col:col+dim] / max(lengths[feature], 1)`` for each ``(feature, col, dim)`` in ``spans``.

    ``pooled`` is ``[batch, columns]``, ``lengths`` ``[features, batch]``; other columns are unchanged and an
    empty bag stays zero (FBGEMM's MEAN of an empty bag).
    """
    if not spans:
        return pooled
    divisor = torch.ones_like(pooled)
    for feature, col, dim in spans:
        divisor[:, col : col + dim] = lengths[feature].clamp(min=1).to(pooled.dtype).unsqueeze(1)
    return pooled / divisor
