"""Assemble a ``Batch`` from per-feature id tensors: the one place that knows the KJT's key-major layout."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rectrain.models.batch import Batch
from rectrain.sparse import KeyedJaggedTensor


def make_batch(
    dense: Tensor,
    keys: Sequence[str],
    values: Sequence[Tensor],
    lengths: Sequence[Tensor],
    labels: Tensor,
) -> Batch:
    """A ``Batch`` whose KJT has, for each key in order, ``lengths[k]`` ([B]) and ``values[k]`` (int64)."""
    # Data enters training here: check the assembled KJT (constructors do not), then cache its sizes.
    kjt = KeyedJaggedTensor(
        keys=list(keys),
        values=torch.cat(list(values)) if values else torch.empty(0, dtype=torch.int64),
        lengths=torch.cat(list(lengths)) if lengths else torch.empty(0, dtype=torch.int32),
    )
    kjt.validate().sync()
    return Batch(dense_features=dense, sparse_features=kjt, labels=labels)


def one_id_per_example(keys: Sequence[str], ids: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Split ``ids`` of shape ``[B, len(keys)]`` (one id per example and feature) into KJT values/lengths."""
    batch = ids.shape[0]
    values = [ids[:, k].contiguous() for k in range(len(keys))]
    lengths = [torch.ones(batch, dtype=torch.int32) for _ in keys]
    return values, lengths
