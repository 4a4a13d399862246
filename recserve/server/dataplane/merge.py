"""One batch from many requests: merged first, then checked once over the merged arrays.

For B examples of R requests and F features, the checks are a handful of numpy passes over the merged
arrays instead of R calls of a dozen tensor ops each; the merge itself is one join of the requests' wire
bytes per array (the KJT's key-major order takes every request's rows of a feature one after another).
The data is checked by the predictor, which checks every batch it is given
(:mod:`recserve.runtime.validation`); here only what the merge itself rests on: each request's lengths of a
feature sum to the ids it sent for it, so that no request's ids are read as another's. When a check fails,
every request is checked alone by its exact path, so the ones at fault get the error naming their field and
the others are scored.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from recserve.server.dataplane.parts import Buffer, RequestParts
from recserve.server.dataplane.validation import InferenceRequest, ModelSchema
from rectrain.sparse import KeyedJaggedTensor

_FP32, _INT64 = np.dtype("<f4"), np.dtype("<i8")


class MergeRefused(Exception):
    """The merged batch failed a check: its requests are checked one by one instead."""


def merge_parts(parts: list[RequestParts], schema: ModelSchema) -> tuple[Tensor, KeyedJaggedTensor]:
    """``(dense [B, W], kjt)`` of ``parts`` in order, or :class:`MergeRefused` if any check fails."""
    width, num_keys = schema.dense_in_features, len(schema.feature_names)
    sizes = [p.batch_size for p in parts]
    total = sum(sizes)
    dense = _joined([p.dense for p in parts], [_FP32] * len(parts), _FP32).reshape(total, width)
    # [F, B]: feature f's lengths of every request, one request after another.
    lengths = _joined(
        [p.lengths[f] for f in range(num_keys) for p in parts],
        [p.lengths_dtype for _ in range(num_keys) for p in parts],
        _INT64,
    ).reshape(num_keys, total)
    counts = _counts(parts, lengths, sizes)
    values = _joined(
        _value_segments(parts, counts), [p.values_dtype for _ in range(num_keys) for p in parts], _INT64
    )
    kjt = KeyedJaggedTensor(
        keys=schema.feature_names,
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(lengths.reshape(-1)),
        stride=total,
        length_per_key=counts.sum(axis=1).tolist(),
        validate=False,
    )
    return torch.from_numpy(dense), kjt


def _joined(segments: list[Buffer], dtypes: list[np.dtype], out: np.dtype) -> np.ndarray:
    """The segments one after another as one writable array of ``out``: one join of their bytes when they
    share a datatype (the usual case), else one conversion each."""
    if all(d == dtypes[0] for d in dtypes):
        array = np.frombuffer(bytearray().join(segments), dtype=dtypes[0])
        return array if dtypes[0] == out else array.astype(out)
    return np.concatenate([np.frombuffer(s, dtype=d) for s, d in zip(segments, dtypes)], dtype=out)


def _counts(parts: list[RequestParts], lengths: np.ndarray, sizes: list[int]) -> np.ndarray:
    """``[F, R]`` ids per feature and request, once every length lies in ``[0, the request's ids]`` (before
    any sum, so int64 lengths cannot wrap) and the sums match the ids sent."""
    sent = [p.ids_sent for p in parts]
    if lengths.size and (lengths.min() < 0 or lengths.max() > max(sent)):
        raise MergeRefused("lengths")
    starts = np.cumsum([0, *sizes[:-1]])
    counts = np.add.reduceat(lengths, starts, axis=1) if lengths.size else lengths.reshape(-1, len(parts))
    if counts.sum(axis=0).tolist() != sent:
        raise MergeRefused("lengths")
    for r, p in enumerate(parts):
        if p.counts is not None and counts[:, r].tolist() != p.counts:
            raise MergeRefused("lengths")
    return counts


def _value_segments(parts: list[RequestParts], counts: np.ndarray) -> list[Buffer]:
    """Every request's ids of feature 0, then of feature 1, ... (the KJT's key-major order)."""
    per_request = []
    for r, p in enumerate(parts):
        if p.values is not None:
            per_request.append(p.values)
            continue
        size = p.values_dtype.itemsize
        ends = np.cumsum(counts[:, r]).tolist()
        per_request.append([p.flat[size * (e - c) : size * e] for e, c in zip(ends, counts[:, r].tolist())])
    return [segments[f] for f in range(counts.shape[0]) for segments in per_request]


def check_each(items: list[RequestParts | InferenceRequest]) -> list[InferenceRequest | Exception]:
    """Each item checked alone by its exact path: the checked request, or the error it gets."""
    out: list[InferenceRequest | Exception] = []
    for item in items:
        if isinstance(item, InferenceRequest) and item.recheck is None:
            out.append(item)
            continue
        try:
            out.append(item.checked() if isinstance(item, RequestParts) else item.recheck())
        except InvalidRequestError as error:
            out.append(error)
    return out
