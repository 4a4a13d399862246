"""Requests in the form the batch merges them from: views of the wire bytes, checked over the whole batch.

The usual request (raw tensors, features the model reads, no weights) is decoded in the handler without a copy
or an array op: its dense rows and each feature's lengths and ids stay the message's bytes, and only sizes and
datatypes are compared, in Python. The batch joins every request's bytes of an array in one call and reads the
result as one array (:mod:`recserve.server.dataplane.merge`). Everything that needs the data (lengths within
bounds and summing to each feature's ids, ids inside their tables, dense values finite and within the
package's bounds) is checked once per batch, over the merged arrays, by the predictor's own checks
(:mod:`recserve.runtime.validation`): per request it cost as much as the predict. A request the batch check
refuses is checked again on its own, by the exact path (``fallback``) that names the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from recserve.server.dataplane.validation import InferenceRequest, ModelSchema

# OIP datatype -> little-endian numpy dtype, for what each input may carry
_LENGTHS = {"INT32": np.dtype("<i4"), "INT64": np.dtype("<i8")}
_VALUES = {"INT64": np.dtype("<i8"), "INT32": np.dtype("<i4")}
_FP32 = np.dtype("<f4")
_ROLE_TYPES = ({"FP32": _FP32}, _LENGTHS, _VALUES)  # dense, lengths, values
Fallback = Callable[[ModelSchema], InferenceRequest]
Buffer = bytes | memoryview  # a raw wire field, or a slice of one


@dataclass(eq=False)
class RequestParts:
    """One request, sizes checked, data not yet, as the wire's bytes (no copy, no array):

    - ``dense``: ``b * W`` little-endian float32;
    - ``lengths[f]``: feature f's ``b`` lengths (model order), all as ``lengths_dtype``;
    - ``values[f]`` and ``counts[f]``: feature f's ids and how many, all as ``values_dtype``; or, as the v1
      API sends them, every feature's ids in one ``flat`` buffer (key-major), split once the batch has
      summed the lengths (``values`` and ``counts`` None).

    ``fallback(schema)`` checks the request alone the exact way against ``schema`` and returns it checked, or
    raises the error that names its field; ``schema`` is the one the parts were cut for (a request that
    meets another version after a reload is checked by its fallback against that one)."""

    batch_size: int
    dense: Buffer
    lengths: list[Buffer]
    lengths_dtype: np.dtype
    values: list[Buffer] | None
    counts: list[int] | None
    flat: Buffer | None
    values_dtype: np.dtype
    schema: ModelSchema
    fallback: Fallback
    request_id: str = ""

    def checked(self, schema: ModelSchema | None = None) -> InferenceRequest:
        """The request checked alone (by ``fallback``) against ``schema`` (default: its own)."""
        return self.fallback(schema or self.schema)

    @property
    def ids_sent(self) -> int:
        if self.counts is None:
            return len(self.flat) // self.values_dtype.itemsize
        return sum(self.counts)


def v1_parts(req, schema: ModelSchema, fallback: Fallback) -> RequestParts | None:
    """A ``recserve.v1`` PredictRequest as parts, or None when it is not in the usual form (typed fields,
    weights, keys in another order, sizes that do not fit): the exact path then decodes and checks it."""
    sp = req.sparse
    b, width, num_keys = req.batch_size, schema.dense_in_features, len(schema.feature_names)
    raw_dense, raw_lengths, raw_values = req.dense.raw, sp.lengths_raw, sp.values_raw
    usual = (
        0 < b <= schema.max_batch_size
        and len(raw_dense) == 4 * b * width
        and len(raw_lengths) == 4 * num_keys * b
        and len(raw_values) % 8 == 0
        and not (sp.weights_raw or len(sp.weights) or len(req.dense.data))
        and not (len(sp.lengths) or len(sp.values))
        and list(sp.keys) == schema.feature_names
        and not schema.weighted_features
    )
    if not usual:
        return None
    lengths = memoryview(raw_lengths)
    return RequestParts(
        batch_size=b,
        dense=raw_dense,
        lengths=[lengths[4 * f * b : 4 * (f + 1) * b] for f in range(num_keys)],
        lengths_dtype=_LENGTHS["INT32"],
        values=None,
        counts=None,
        flat=memoryview(raw_values),
        values_dtype=_VALUES["INT64"],
        schema=schema,
        fallback=fallback,
        request_id=req.request_id,
    )


class OipLayout:
    """Where each input of the usual OIP request goes: ``dense``, ``<f>.lengths``, ``<f>.values`` of an
    unweighted model (built once per schema)."""

    def __init__(self, schema: ModelSchema) -> None:
        self.schema = schema
        self.count = 1 + 2 * len(schema.feature_names)
        self.slots: dict[str, tuple[int, int]] = {"dense": (0, 0)}  # name -> (role, feature index)
        for i, f in enumerate(schema.feature_names):
            self.slots[f"{f}.lengths"] = (1, i)
            self.slots[f"{f}.values"] = (2, i)
        self.usable = not schema.weighted_features

    def parts(self, req, fallback: Fallback) -> RequestParts | None:
        """``req`` (a ModelInferRequest whose parameters and outputs were checked) as parts, or None when it
        is not the usual form (typed contents, weights, input parameters, mixed id or length datatypes,
        sizes that do not fit)."""
        raws, inputs = req.raw_input_contents, req.inputs
        if not self.usable or len(inputs) != self.count or len(raws) != self.count:
            return None
        num_keys = len(self.schema.feature_names)
        dense, b = None, -1
        lengths: list = [None] * num_keys
        values: list = [None] * num_keys
        counts: list = [0] * num_keys
        types = [None, None, None]  # the datatype of dense, of every lengths input, of every values input
        for tensor, raw in zip(inputs, raws):
            slot = self.slots.get(tensor.name)
            if slot is None or len(tensor.parameters) or tensor.HasField("contents"):
                return None
            role, i = slot
            shape, datatype = tensor.shape, tensor.datatype
            if types[role] != datatype:
                if types[role] is not None or datatype not in _ROLE_TYPES[role]:
                    return None
                types[role] = datatype
            if role == 0:
                if len(shape) != 2 or dense is not None or shape[1] != self.schema.dense_in_features:
                    return None
                b, dense = shape[0], raw
                if len(raw) != 4 * b * shape[1]:
                    return None
                continue
            n = shape[0] if len(shape) == 1 else -1
            target = lengths if role == 1 else values
            if n < 0 or len(raw) != _ROLE_TYPES[role][datatype].itemsize * n or target[i] is not None:
                return None
            target[i] = raw
            if role == 2:
                counts[i] = n
        if dense is None or not 0 < b <= self.schema.max_batch_size:
            return None
        if any(len(x) != b * _ROLE_TYPES[1][types[1]].itemsize for x in lengths):
            return None
        lengths_dtype, values_dtype = _ROLE_TYPES[1][types[1]], _ROLE_TYPES[2][types[2]]
        return RequestParts(
            b,
            dense,
            lengths,
            lengths_dtype,
            values,
            counts,
            None,
            values_dtype,
            self.schema,
            fallback,
            req.id,
        )
