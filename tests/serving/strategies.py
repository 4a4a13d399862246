"""Hypothesis strategies: structurally valid requests for both services, then one field broken at a time.

A request is drawn as a :class:`Spec` (per-feature lengths and ids, dense rows) valid for the tiny model of
``conftest``; a mutation then breaks one thing (a length, an id, the batch size, a dtype, a shape, raw bytes,
an output, a parameter...). Every mutation here makes the request invalid, so the server must answer
INVALID_ARGUMENT; ``None`` leaves it valid (OK expected).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from hypothesis import strategies as st

from recserve.server.transports.protos import oip_pb2, pb2

from .conftest import DENSE, FEATURES, ROWS

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
# lengths a hostile client sends: each is outside [0, number of values] for any request drawn here
HUGE_INT64_LENGTHS = [2**62, 2**62 + 3, I64_MAX, I64_MIN, -1, 2**32, 2**31]
HUGE_INT32_LENGTHS = [I32_MAX, I32_MIN, -1, 2**30 + 7]


@dataclass
class Spec:
    batch: int
    dense: np.ndarray  # float32 [batch, DENSE]
    keys: list[str]
    lengths: list[np.ndarray]  # int64 [batch] per key (any int64 once mutated)
    values: list[np.ndarray]  # int64 per key
    weights: list[np.ndarray] | None = None
    dense_shape: list[int] = field(default_factory=list)  # OIP only; [] means dense.shape

    def flat_lengths(self) -> np.ndarray:
        return np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)


@st.composite
def valid_specs(draw, min_batch: int = 1) -> Spec:
    b = draw(st.integers(min_batch, 4))
    lengths, values = [], []
    for rows in ROWS:
        ls = np.array(draw(st.lists(st.integers(0, 3), min_size=b, max_size=b)), dtype=np.int64)
        lengths.append(ls)
        n = int(ls.sum())
        values.append(np.array(draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n)), np.int64))
    floats = st.floats(-1e3, 1e3, width=32)
    dense = np.array(draw(st.lists(floats, min_size=b * DENSE, max_size=b * DENSE)), np.float32)
    return Spec(b, dense.reshape(b, DENSE), list(FEATURES), lengths, values)


def _wrap_lengths(spec: Spec, draw, step: int, to_zero: bool) -> Spec:
    """Adds ``step`` to four lengths so that their sum wraps (2^62 x 4 = 2^64 in int64, 2^30 x 4 in int32);
    ``to_zero`` also drops every id, so the wrapped sum equals the zero values sent."""
    flat = spec.flat_lengths().copy()
    if to_zero:
        flat[:] = 0
    picks = draw(st.lists(st.integers(0, len(flat) - 1), min_size=4, max_size=4, unique=True))
    for p in picks:
        flat[p] += step
    b = spec.batch
    lengths = [flat[i * b : (i + 1) * b] for i in range(len(spec.keys))]
    values = [v[:0] for v in spec.values] if to_zero else spec.values
    return replace(spec, lengths=lengths, values=values)


def _with_length(spec: Spec, draw, choices: list[int]) -> Spec:
    k = draw(st.integers(0, len(spec.keys) - 1))
    i = draw(st.integers(0, spec.batch - 1))
    lengths = [ls.copy() for ls in spec.lengths]
    lengths[k][i] = draw(st.sampled_from(choices))
    return replace(spec, lengths=lengths)


def _with_id(spec: Spec, draw) -> Spec:
    full = [k for k, v in enumerate(spec.values) if v.size]
    if not full:  # no ids to break: send one id that no length accounts for
        values = [v.copy() for v in spec.values]
        values[0] = np.array([1], np.int64)
        return replace(spec, values=values)
    k = draw(st.sampled_from(full))
    values = [v.copy() for v in spec.values]
    values[k][draw(st.integers(0, values[k].size - 1))] = draw(
        st.sampled_from([-1, ROWS[k], I64_MAX, I64_MIN])
    )
    return replace(spec, values=values)


def _with_dense(spec: Spec, draw) -> Spec:
    dense = spec.dense.copy()
    dense.reshape(-1)[draw(st.integers(0, dense.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    return replace(spec, dense=dense)


def _with_keys(spec: Spec, draw) -> Spec:
    how = draw(st.sampled_from(["unknown", "duplicate", "missing"]))
    if how == "missing":
        return replace(spec, keys=spec.keys[:-1], lengths=spec.lengths[:-1], values=spec.values[:-1])
    keys = list(spec.keys)
    keys[-1] = "zz" if how == "unknown" else keys[0]
    return replace(spec, keys=keys)


SPEC_BREAKS = ["length", "wrap_to_count", "wrap_to_zero", "id", "dense", "keys", "weights"]


def break_spec(draw, spec: Spec, what: str | None, int64_lengths: bool) -> tuple[str | None, Spec]:
    """``(what was broken, spec)`` for the breaks both APIs can carry (``spec`` has >= 2 examples)."""
    step = 2**62 if int64_lengths else 2**30
    huge = HUGE_INT64_LENGTHS if int64_lengths else HUGE_INT32_LENGTHS
    if what == "length":
        spec = _with_length(spec, draw, huge + [int(spec.flat_lengths().sum()) + 1])
    elif what in ("wrap_to_count", "wrap_to_zero"):
        spec = _wrap_lengths(spec, draw, step, to_zero=what == "wrap_to_zero")
    elif what == "id":
        spec = _with_id(spec, draw)
    elif what == "dense":
        spec = _with_dense(spec, draw)
    elif what == "keys":
        spec = _with_keys(spec, draw)
    elif what == "weights" and not any(v.size for v in spec.values):
        what, spec = "id", _with_id(spec, draw)  # zero ids carry no weights on the v1 wire
    elif what == "weights":  # the tiny model has no weighted features
        spec = replace(spec, weights=[np.ones(v.size, np.float32) for v in spec.values])
    return what, spec


# ---- recserve.v1 Predictor ----


def predict_request(spec: Spec, raw: bool, batch_size: int | None = None) -> pb2.PredictRequest:
    req = pb2.PredictRequest(batch_size=spec.batch if batch_size is None else batch_size, raw_output=raw)
    sp = req.sparse
    sp.keys.extend(spec.keys)
    lengths = spec.flat_lengths().astype("<i4")  # the v1 wire is int32: wraps like a C client's cast
    values = np.concatenate(spec.values) if spec.values else np.zeros(0, np.int64)
    if raw:
        req.dense.raw = spec.dense.astype("<f4").tobytes()
        sp.lengths_raw, sp.values_raw = lengths.tobytes(), values.astype("<i8").tobytes()
        if spec.weights is not None:
            sp.weights_raw = np.concatenate(spec.weights).astype("<f4").tobytes()
    else:
        req.dense.data.extend(spec.dense.reshape(-1).tolist())
        sp.lengths.extend(lengths.tolist())
        sp.values.extend(values.tolist())
        if spec.weights is not None:
            sp.weights.extend(np.concatenate(spec.weights).tolist())
    return req


def _truncate(field_name: str):
    def mutate(req):
        *path, leaf = field_name.split(".")
        msg = req
        for p in path:
            msg = getattr(msg, p)
        data = getattr(msg, leaf)
        setattr(msg, leaf, data[:-1] if data else b"\x01")

    return mutate


V1_WIRE_BREAKS = {
    "truncated_lengths": _truncate("sparse.lengths_raw"),
    "truncated_values": _truncate("sparse.values_raw"),
    "truncated_dense": _truncate("dense.raw"),
    "typed_and_raw": lambda r: r.sparse.lengths.append(1),
    "extra_dense": lambda r: setattr(r.dense, "raw", r.dense.raw + b"\x00" * 4),
}


@st.composite
def broken_predict_requests(draw) -> tuple[str | None, pb2.PredictRequest]:
    spec = draw(valid_specs(min_batch=2))
    raw = draw(st.booleans())
    what = draw(st.sampled_from([None, *SPEC_BREAKS, "batch_size", *V1_WIRE_BREAKS]))
    if what == "batch_size":
        bad = draw(st.sampled_from([0, -1, I32_MIN, I32_MAX, spec.batch + 1, spec.batch - 1]))
        return f"batch_size={bad}", predict_request(spec, raw, batch_size=bad)
    if what in V1_WIRE_BREAKS:
        req = predict_request(spec, raw=True)
        V1_WIRE_BREAKS[what](req)
        return what, req
    what, spec = break_spec(draw, spec, what, int64_lengths=False)
    return what, predict_request(spec, raw)


# ---- Open Inference Protocol v2 ----


def infer_request(spec: Spec, raw: bool, lengths_dtype: str = "INT64") -> oip_pb2.ModelInferRequest:
    req = oip_pb2.ModelInferRequest(model_name="tiny")
    tensors = [("dense", "FP32", spec.dense_shape or list(spec.dense.shape), spec.dense.reshape(-1))]
    for i, k in enumerate(spec.keys):
        le = "<i8" if lengths_dtype == "INT64" else "<i4"
        tensors.append((f"{k}.lengths", lengths_dtype, [spec.lengths[i].size], spec.lengths[i].astype(le)))
        tensors.append((f"{k}.values", "INT64", [spec.values[i].size], spec.values[i].astype("<i8")))
        if spec.weights is not None:
            tensors.append((f"{k}.weights", "FP32", [spec.weights[i].size], spec.weights[i].astype("<f4")))
    contents = {"FP32": "fp32_contents", "INT32": "int_contents", "INT64": "int64_contents"}
    for name, dtype, shape, arr in tensors:
        t = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        else:
            getattr(t.contents, contents[dtype]).extend(arr.tolist())
    return req


def _set_shape(index: int, dims: list[int]):
    return lambda r: r.inputs[index].shape.__setitem__(slice(None), dims)


def _param(name: str, **value):
    return lambda r: r.parameters[name].CopyFrom(oip_pb2.InferParameter(**value))


OIP_WIRE_BREAKS = {
    "datatype_fp64": lambda r: setattr(r.inputs[1], "datatype", "FP64"),
    "datatype_bytes": lambda r: setattr(r.inputs[2], "datatype", "BYTES"),
    "datatype_empty": lambda r: setattr(r.inputs[0], "datatype", ""),
    "dense_shape_wraps": _set_shape(0, [2**32, 2**32]),
    "dense_shape_i64max": _set_shape(0, [I64_MAX, 1]),
    "dense_shape_negative": _set_shape(0, [-1, -DENSE]),
    "dense_width": lambda r: r.inputs[0].shape.__setitem__(1, DENSE + 1),
    "dense_rank": _set_shape(0, [1]),
    "lengths_shape_i64min": _set_shape(1, [I64_MIN]),
    "truncated_raw": lambda r: r.raw_input_contents.__setitem__(1, r.raw_input_contents[1][:-1] or b"\x01"),
    "raw_entry_missing": lambda r: r.raw_input_contents.pop(),
    "input_twice": lambda r: (
        r.inputs.append(r.inputs[1]),
        r.raw_input_contents.append(r.raw_input_contents[1]),
    ),
    "unknown_input": lambda r: setattr(r.inputs[1], "name", "f0.offsets"),
    "orphan_values": lambda r: setattr(r.inputs[2], "name", "zz.values"),
    "unknown_output": lambda r: r.outputs.add(name="logits"),
    "priority_string": _param("priority", string_param="1"),
    "timeout_bool": _param("timeout", bool_param=True),
    "timeout_negative": _param("timeout", int64_param=-1),
    "sequence_end_string": _param("sequence_end", string_param="true"),
}


@st.composite
def broken_infer_requests(draw) -> tuple[str | None, oip_pb2.ModelInferRequest]:
    spec = draw(valid_specs(min_batch=2))
    raw = draw(st.booleans())
    what = draw(st.sampled_from([None, *SPEC_BREAKS, "batch", *OIP_WIRE_BREAKS]))
    wraps = what in ("length", "wrap_to_count", "wrap_to_zero")  # values only INT64 lengths can carry
    dtype = "INT64" if wraps else draw(st.sampled_from(["INT32", "INT64"]))
    if what == "batch":
        bad = draw(st.sampled_from([0, spec.batch + 1, 2**62, I64_MAX]))
        return f"batch={bad}", infer_request(replace(spec, dense_shape=[bad, DENSE]), raw, dtype)
    if what in OIP_WIRE_BREAKS:
        req = infer_request(spec, raw=True, lengths_dtype=dtype)
        OIP_WIRE_BREAKS[what](req)
        return what, req
    what, spec = break_spec(draw, spec, what, int64_lengths=True)
    return what, infer_request(spec, raw, dtype)
