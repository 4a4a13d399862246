"""Assemble a ``Batch`` from per-feature id tensors: the one place that knows the KJT's key-major layout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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


def batch_from_arrays(keys: Sequence[str], labels: np.ndarray, dense: np.ndarray, ids: np.ndarray) -> Batch:
    """A ``Batch`` of one id per example and feature from NumPy arrays, with no per-row Python.

    ``ids`` is ``[len(keys), B]`` (feature-major, the KJT's key-major order) of any integer type; the batch
    holds its own copies as float32 labels ``[B]``, float32 dense ``[B, D]`` and int64 values.
    """
    batch, num_keys = len(labels), len(keys)
    values = torch.from_numpy(np.array(ids, dtype=np.int64, order="C", copy=True)).reshape(-1)
    # Valid by construction (every example has one id per key), so the per-key sizes are known: no checks
    # and no host sync, which cost more than the copies above.
    kjt = KeyedJaggedTensor(
        keys=list(keys),
        values=values,
        lengths=torch.ones(num_keys * batch, dtype=torch.int32),
        stride=batch,
        length_per_key=[batch] * num_keys,
        offset_per_key=[batch * k for k in range(num_keys + 1)],
        validate=False,
    )
    return Batch(
        dense_features=torch.from_numpy(np.array(dense, dtype=np.float32, copy=True)),
        sparse_features=kjt,
        labels=torch.from_numpy(np.array(labels, dtype=np.float32, copy=True)),
    )
