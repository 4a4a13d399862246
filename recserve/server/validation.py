"""Checks a decoded request against the served model and builds the tensors the predictor takes.

Every failure raises :class:`InvalidRequestError` naming the wire field and the numbers involved; the server
turns it into INVALID_ARGUMENT and goes on serving. Ids outside a table are rejected, never clamped or hashed
(a package records no hashing, so an out-of-range id is a client bug worth surfacing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from recserve.runtime.dense_bounds import DenseBounds
from recserve.runtime.scripted import script_or_eager
from recserve.server.arrays import FeatureArrays
from rectrain.sparse import KeyedJaggedTensor


@dataclass(frozen=True)
class ModelSchema:
    """What a request must look like for one model version (built once per loaded package)."""

    model_name: str
    version: str
    feature_names: list[str]
    num_embeddings: Tensor  # int64 [F], valid ids of feature i are [0, num_embeddings[i])
    dense_in_features: int
    weighted_features: frozenset[str]
    max_batch_size: int
    dense_bounds: DenseBounds | None = None

    @staticmethod
    def from_metadata(metadata, max_batch_size: int) -> ModelSchema:
        """From a ``recserve.runtime.PackageMetadata``."""
        names = list(metadata.feature_names)
        return ModelSchema(
            model_name=metadata.model_name,
            version=str(metadata.version),
            feature_names=names,
            num_embeddings=torch.tensor([int(metadata.num_embeddings[n]) for n in names], dtype=torch.int64),
            dense_in_features=int(metadata.dense_in_features),
            weighted_features=frozenset(metadata.weighted_features),
            max_batch_size=max_batch_size,
            dense_bounds=getattr(metadata, "dense_bounds", None),
        )


@dataclass(frozen=True)
class InferenceRequest:
    """A checked request: ``dense`` ``[B, W]`` float32 and a KJT whose keys are the model's, in its order."""

    dense: Tensor
    kjt: KeyedJaggedTensor
    request_id: str = ""

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])


def check_request(arrays: FeatureArrays, schema: ModelSchema) -> InferenceRequest:
    """Validates ``arrays`` against ``schema``; returns tensors ready for the batcher."""
    b = arrays.batch_size
    if b <= 0:
        raise InvalidRequestError(f"batch_size: must be >= 1, got {b} (empty request)")
    if b > schema.max_batch_size:
        raise InvalidRequestError(
            f"batch_size: {b} examples exceeds the server's max_batch_size {schema.max_batch_size}; split it"
        )
    order = _key_order(arrays.keys, schema.feature_names)
    values, weights = arrays.values, arrays.weights
    checked = None
    if order is None and weights is None:
        checked = _checked_tensors(
            arrays.dense, arrays.lengths, values, schema.num_embeddings, b, schema.dense_in_features
        )
    if checked is not None:
        dense, lengths, per_key = checked
    else:  # keys to re-order, weights, or a check failed: this path also names what is wrong
        dense = _check_dense(arrays.dense, b, schema.dense_in_features)
        lengths = _check_lengths(arrays.lengths, arrays.keys, b, values.numel())
        if weights is not None:
            _check_weights(weights, values.numel(), arrays.keys, schema)
        num_keys = len(arrays.keys)
        per_key = lengths.view(num_keys, b).sum(dim=1)
        if order is not None:
            lengths, values, weights, per_key = _permute(
                order, lengths.view(num_keys, b), values, weights, per_key
            )
        _check_ids(values, per_key, schema)
    if schema.dense_bounds is not None:
        dense = schema.dense_bounds.apply(dense)
    kjt = KeyedJaggedTensor(
        keys=schema.feature_names,
        values=values,
        weights=weights,
        lengths=lengths,
        stride=b,
        length_per_key=per_key.tolist(),
        validate=False,
    )
    return InferenceRequest(dense, kjt, arrays.request_id)


@script_or_eager
def _checked_tensors(
    dense: Tensor, lengths: Tensor, values: Tensor, num_embeddings: Tensor, b: int, width: int
) -> tuple[Tensor, Tensor, Tensor] | None:
    """What ``check_request`` checks of an unweighted request whose keys are in the model's order, in one
    call: ``(dense [b, width], int64 lengths, ids per key)``, or None if a check fails."""
    if dense.numel() != b * width or lengths.numel() != num_embeddings.numel() * b:
        return None
    dense = dense.view(b, width)
    if not bool(torch.isfinite(dense).all()):
        return None
    n = values.numel()
    lengths = lengths.to(torch.int64)
    if bool(((lengths < 0) | (lengths > n)).any()):  # bounded before the sum, so it cannot wrap
        return None
    per_key = lengths.view(num_embeddings.numel(), b).sum(dim=1)
    if int(per_key.sum()) != n:
        return None
    if n > 0:
        bound = torch.repeat_interleave(num_embeddings, per_key, output_size=n)
        if bool(((values < 0) | (values >= bound)).any()):
            return None
    return dense, lengths, per_key


def _check_lengths(lengths: Tensor, keys: list[str], b: int, num_values: int) -> Tensor:
    """``lengths`` as int64 once each lies in ``[0, num_values]`` and together they sum to ``num_values``.

    The element-wise bound comes before any sum: a sum of unbounded int64 lengths wraps modulo 2^64 (four
    lengths of 2^62 "sum" to 0), which would let a lying request reach the kernels. Bounded, the sum cannot
    wrap: a message holds fewer than 2^31 lengths and 2^31 values, so it stays below 2^62.
    """
    if lengths.numel() != len(keys) * b:
        raise InvalidRequestError(
            f"sparse.lengths: expected {len(keys)} keys x {b} examples = {len(keys) * b} entries, "
            f"got {lengths.numel()}"
        )
    lengths = lengths.to(torch.int64)
    if lengths.numel() == 0:
        total = 0
    else:
        smallest, largest = (int(x) for x in torch.aminmax(lengths))
        if smallest < 0 or largest > num_values:
            pos = int(((lengths < 0) | (lengths > num_values)).nonzero()[0])
            bad, where = int(lengths[pos]), f"(feature {keys[pos // b]!r}, example {pos % b})"
            if bad < 0:
                raise InvalidRequestError(f"sparse.lengths: negative length {bad} {where}")
            raise InvalidRequestError(
                f"sparse.lengths: length {bad} {where} is more than the {num_values} values sent"
            )
        total = int(lengths.sum())
    if total != num_values:
        raise InvalidRequestError(f"sparse.values: lengths sum to {total} but {num_values} values were sent")
    return lengths


def _check_weights(weights: Tensor, num_values: int, keys: list[str], schema: ModelSchema) -> None:
    unweighted = [k for k in keys if k not in schema.weighted_features]
    if unweighted:
        raise InvalidRequestError(
            f"sparse.weights: feature {unweighted[0]!r} is not weighted in model {schema.model_name!r} "
            f"(weighted features: {sorted(schema.weighted_features)}); send no weights"
        )
    if weights.numel() != num_values:
        raise InvalidRequestError(
            f"sparse.weights: {weights.numel()} weights for {num_values} values (one per value, or none)"
        )
    finite = torch.isfinite(weights)
    if not bool(finite.all()):
        pos = int((~finite).nonzero()[0])
        raise InvalidRequestError(f"sparse.weights: NaN or inf at value {pos} ({weights[pos].item()})")


def _check_dense(dense: Tensor, b: int, width: int) -> Tensor:
    if dense.numel() != b * width:
        raise InvalidRequestError(
            f"dense: expected {b} examples x {width} features = {b * width} floats, got {dense.numel()}"
        )
    dense = dense.view(b, width)
    finite = torch.isfinite(dense)
    if not bool(finite.all()):
        row, col = (~finite).nonzero()[0].tolist()
        raise InvalidRequestError(
            f"dense: NaN or inf at example {row}, feature {col} ({dense[row, col].item()})"
        )
    return dense


def _key_order(keys: list[str], expected: list[str]) -> list[int] | None:
    """Indices that put ``keys`` in ``expected`` order (None when already there)."""
    if keys == expected:
        return None
    known = set(expected)  # once: a request may send many keys, and each is looked up
    index = {}
    for i, k in enumerate(keys):
        if k in index:
            raise InvalidRequestError(f"sparse.keys: feature {k!r} appears twice")
        if k not in known:
            raise InvalidRequestError(
                f"sparse.keys: unknown feature {k!r} (the model's features: {expected})"
            )
        index[k] = i
    missing = [k for k in expected if k not in index]
    if missing:
        raise InvalidRequestError(f"sparse.keys: missing feature {missing[0]!r} (the model needs {expected})")
    return [index[k] for k in expected]


def _permute(
    order: list[int], lengths_2d: Tensor, values: Tensor, weights: Tensor | None, per_key: Tensor
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    splits = per_key.tolist()
    value_parts = torch.split(values, splits)
    new_values = torch.cat([value_parts[i] for i in order])
    new_weights = None
    if weights is not None:
        weight_parts = torch.split(weights, splits)
        new_weights = torch.cat([weight_parts[i] for i in order])
    idx = torch.tensor(order)
    return lengths_2d[idx].reshape(-1), new_values, new_weights, per_key[idx]


def _check_ids(values: Tensor, per_key: Tensor, schema: ModelSchema) -> None:
    if values.numel() == 0:
        return
    bound = torch.repeat_interleave(schema.num_embeddings, per_key)
    bad = (values < 0) | (values >= bound)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0])
        key = int(torch.searchsorted(torch.cumsum(per_key, 0), pos, right=True))
        name = schema.feature_names[key]
        raise InvalidRequestError(
            f"sparse.values: feature {name!r} has id {int(values[pos])} outside its table's range "
            f"[0, {int(schema.num_embeddings[key])})"
        )
