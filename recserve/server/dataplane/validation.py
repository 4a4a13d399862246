"""The rules of the wire, on top of the one set of data checks (:mod:`recserve.runtime.validation`).

A request's data (dense values finite, lengths bounded and summing to the ids sent, ids inside their tables,
weights one per id) is checked by the runtime's :class:`RequestValidator`, the one every predictor runs
before its kernels, here with the wire's :class:`RequestFields` so that errors name the fields the client
sent. This module adds only what the wire decides: the batch size (at least 1, at most ``max_batch_size``),
no feature the model lacks, weights only for weighted features, a dense field of ``batch x width`` floats,
the key order of the model, and the package's dense bounds. Ids outside a table are refused, never clamped or
hashed (a package records no hashing, so an out-of-range id is a client bug worth surfacing).

The server queues a request past the wire rules (:func:`admit_request`) and the predictor checks its data
with its batch, once; a batch it refuses is checked request by request (:func:`check_request`), so the ones
at fault get the error that names their field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from recserve.runtime.dense_bounds import DenseBounds
from recserve.runtime.validation import RequestFields, RequestValidator
from recserve.server.dataplane.arrays import FeatureArrays
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

    @cached_property
    def validator(self) -> RequestValidator:
        """The predictor's data checks for this model, to check one request alone."""
        rows = dict(zip(self.feature_names, self.num_embeddings.tolist()))
        return RequestValidator(self.dense_in_features, rows)


@dataclass(frozen=True)
class InferenceRequest:
    """A request past the wire rules: ``dense`` ``[B, W]`` float32 and a KJT in the model's key order.

    ``recheck`` None: its data was checked too; otherwise the predictor checks it with its batch, and
    ``recheck()`` checks it alone (raising the error that names its field) when the batch is refused."""

    dense: Tensor
    kjt: KeyedJaggedTensor
    request_id: str = ""
    recheck: Callable[[], InferenceRequest] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])


def check_request(arrays: FeatureArrays, schema: ModelSchema) -> InferenceRequest:
    """``arrays`` checked alone, wire rules and data, against ``schema``; errors name ``arrays.fields``."""
    order, dense = _wire_rules(arrays, schema, arrays.fields)
    _, kjt = schema.validator.safe_batch(dense, _kjt(arrays), fields=arrays.fields, sent=arrays.counts)
    if schema.dense_bounds is not None:
        dense = schema.dense_bounds.apply(dense)
    return InferenceRequest(dense, kjt if order is None else kjt.permute(order), arrays.request_id)


def admit_request(arrays: FeatureArrays, schema: ModelSchema) -> InferenceRequest:
    """``arrays`` past the wire rules, its data left to the predictor's check of its batch (``recheck``
    checks it alone). Lengths that cannot even cut the ids into features are checked alone at once."""
    order, dense = _wire_rules(arrays, schema, arrays.fields)
    b, lengths, values, sent = arrays.batch_size, arrays.lengths, arrays.values, arrays.counts
    if lengths.numel() != len(arrays.keys) * b:
        return check_request(arrays, schema)
    per_key = lengths.to(torch.int64).view(len(arrays.keys), b).sum(dim=1)  # may wrap: the check bounds
    if (
        bool((per_key < 0).any())
        or int(per_key.sum()) != values.numel()
        or (sent is not None and per_key.tolist() != sent)
        or (arrays.weights is not None and arrays.weights.numel() != values.numel())
    ):
        return check_request(arrays, schema)
    kjt = _kjt(arrays, per_key.tolist())
    kjt = kjt if order is None else kjt.permute(order)
    return InferenceRequest(dense, kjt, arrays.request_id, lambda: check_request(arrays, schema))


def _kjt(arrays: FeatureArrays, length_per_key: list[int] | None = None) -> KeyedJaggedTensor:
    """The request's features as sent (its key order; nothing checked)."""
    return KeyedJaggedTensor(
        keys=arrays.keys,
        values=arrays.values,
        weights=arrays.weights,
        lengths=arrays.lengths,
        stride=arrays.batch_size,
        length_per_key=length_per_key,
        validate=False,
    )


def _wire_rules(
    arrays: FeatureArrays, schema: ModelSchema, fields: RequestFields
) -> tuple[list[int] | None, Tensor]:
    """``(the order that puts the keys in the model's, or None; dense as [B, W])`` once the wire's rules
    hold: a batch size the server takes, the model's features only, weights where the model has them."""
    b = arrays.batch_size
    if b <= 0:
        raise InvalidRequestError(f"batch_size: must be >= 1, got {b} (empty request)")
    if b > schema.max_batch_size:
        raise InvalidRequestError(
            f"batch_size: {b} examples exceeds the server's max_batch_size {schema.max_batch_size}; split it"
        )
    keys, expected = arrays.keys, schema.feature_names
    order = None
    if keys != expected:
        known = set(expected)
        unknown = [k for k in keys if k not in known]
        if unknown:
            raise InvalidRequestError(
                f"{fields.keys}: unknown feature {unknown[0]!r} (the model's features: {expected})"
            )
        index = {k: i for i, k in enumerate(keys)}
        if len(index) == len(keys) and len(index) == len(expected):
            order = [index[k] for k in expected]
        else:
            schema.validator.check_keys(keys, fields)  # names the feature sent twice or missing
    if arrays.weights is not None:
        check_weighted(keys, schema, fields)
    width, dense = schema.dense_in_features, arrays.dense
    if dense.numel() != b * width:
        raise InvalidRequestError(
            f"{fields.dense}: expected {b} examples x {width} features = {b * width} floats, "
            f"got {dense.numel()}"
        )
    return order, dense.view(b, width)


def check_weighted(keys: list[str], schema: ModelSchema, fields: RequestFields) -> None:
    """InvalidRequestError naming the first of ``keys`` (features sent with weights) the model does not
    weight: weights for it would be ignored, so the client would be scored on data it did not mean."""
    unweighted = [k for k in keys if k not in schema.weighted_features]
    if unweighted:
        raise InvalidRequestError(
            f"{fields.of('weights', unweighted[0])}: feature {unweighted[0]!r} is not weighted in model "
            f"{schema.model_name!r} (weighted features: {sorted(schema.weighted_features)}); send no "
            "weights for it"
        )
