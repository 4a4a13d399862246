"""Wire codec and request checks: hypothesis round trips through serialized protobuf, and every bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from recserve.errors import InvalidRequestError
from recserve.runtime import PackageMetadata
from recserve.server.dataplane.runner import merge_requests
from recserve.server.dataplane.validation import ModelSchema, check_request
from recserve.server.transports.codec import (
    decode_predict_request,
    encode_predict_request,
    scores_of,
    set_scores,
)
from recserve.server.transports.protos import pb2
from rectrain.sparse import KeyedJaggedTensor

FEATURES = ["a", "b", "c"]
ROWS = {"a": 10, "b": 1000, "c": 3}


def schema(width: int = 4, max_batch_size: int = 64, weighted: bool = False) -> ModelSchema:
    md = PackageMetadata("m", "1", FEATURES, width, ROWS, FEATURES if weighted else [], {})
    return ModelSchema.from_metadata(md, max_batch_size)


@st.composite
def requests(draw, keys=FEATURES, width=4, weighted=None):
    b = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 4), min_size=len(keys) * b, max_size=len(keys) * b))
    values = []
    for k_i, k in enumerate(keys):
        for n in lengths[k_i * b : (k_i + 1) * b]:
            values += draw(st.lists(st.integers(0, ROWS[k] - 1), min_size=n, max_size=n))
    dense = torch.tensor(
        draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=b * width, max_size=b * width)),
        dtype=torch.float32,
    ).reshape(b, width)
    weighted = draw(st.booleans()) if weighted is None else weighted
    weights = torch.rand(len(values)) if weighted else None
    kjt = KeyedJaggedTensor(
        keys=list(keys),
        values=torch.tensor(values, dtype=torch.int64),
        weights=weights,
        lengths=torch.tensor(lengths),
    )
    return dense, kjt


def roundtrip(dense, kjt, raw: bool, s: ModelSchema | None = None):
    wire = encode_predict_request(dense, kjt, request_id="r1", raw=raw).SerializeToString()
    s = s or schema(weighted=kjt.weights_or_none() is not None)
    return check_request(decode_predict_request(pb2.PredictRequest.FromString(wire)), s)


@given(requests(), st.booleans())
def test_roundtrip_typed_and_raw(req, raw):
    dense, kjt = req
    out = roundtrip(dense, kjt, raw)
    assert out.request_id == "r1"
    assert torch.equal(out.dense, dense)
    assert out.kjt.keys() == FEATURES
    assert torch.equal(out.kjt.lengths(), kjt.lengths().to(torch.int64))
    assert torch.equal(out.kjt.values(), kjt.values())
    if kjt.weights_or_none() is None or not kjt.values().numel():
        assert out.kjt.weights_or_none() is None
    else:
        assert torch.equal(out.kjt.weights(), kjt.weights())


@given(requests(keys=["c", "a", "b"], weighted=True))
def test_keys_in_another_order_are_permuted_to_the_models(req):
    dense, kjt = req
    out = roundtrip(dense, kjt, raw=True)
    assert out.kjt.keys() == FEATURES
    for k in FEATURES:
        assert torch.equal(out.kjt[k].lengths(), kjt[k].lengths().to(torch.int64))
        assert torch.equal(out.kjt[k].values(), kjt[k].values())
        if kjt.values().numel():  # zero ids carry no weights on the wire
            assert torch.equal(out.kjt[k].weights(), kjt[k].weights())


@given(st.lists(requests(weighted=False), min_size=1, max_size=4))
def test_merged_batch_holds_every_requests_rows_per_key(reqs):
    checked = [roundtrip(d, k, raw=True) for d, k in reqs]
    dense, kjt = merge_requests(checked)
    assert torch.equal(dense, torch.cat([d for d, _ in reqs]))
    for key in FEATURES:
        jt = kjt[key]
        assert torch.equal(jt.lengths(), torch.cat([k[key].lengths() for _, k in reqs]).to(torch.int64))
        assert torch.equal(jt.values(), torch.cat([k[key].values() for _, k in reqs]))


@given(st.lists(st.floats(0, 1, width=32), max_size=20), st.booleans())
def test_scores_roundtrip(values, raw):
    resp = pb2.PredictResponse()
    set_scores(resp, torch.tensor(values, dtype=torch.float32), raw)
    assert scores_of(pb2.PredictResponse.FromString(resp.SerializeToString())).tolist() == values


def good_request(b: int = 2) -> pb2.PredictRequest:
    kjt = KeyedJaggedTensor(
        keys=FEATURES, values=torch.tensor([1, 2, 3, 4, 5, 6]), lengths=torch.tensor([1, 1, 1, 1, 1, 1])
    )
    return encode_predict_request(torch.zeros(b, 4), kjt, raw=True)


def _set(req, path, value):
    *parents, leaf = path.split(".")
    msg = req
    for p in parents:
        msg = getattr(msg, p)
    if isinstance(value, list):
        field = getattr(msg, leaf)
        del field[:]
        field.extend(value)
    else:
        setattr(msg, leaf, value)


BAD = [
    ("batch_size", 0, "empty request"),
    ("batch_size", 65, "exceeds the server's max_batch_size 64"),
    ("sparse.lengths_raw", b"\x01\x00\x00\x00" * 5, "expected 3 keys x 2 examples = 6 entries, got 5"),
    ("sparse.lengths_raw", b"\x02\x00\x00\x00" + b"\x01\x00\x00\x00" * 5, "lengths sum to 7 but 6 values"),
    ("sparse.lengths_raw", b"\xff\xff\xff\xff" + b"\x01\x00\x00\x00" * 5, "negative length -1"),
    ("sparse.values_raw", b"\x00" * 47, "47 bytes is not a multiple of 8"),
    (
        "sparse.values_raw",
        b"\x00" * 40 + b"\x0a" + b"\x00" * 7,
        "feature 'c' has id 10 outside its table's range \\[0, 3\\)",
    ),
    ("sparse.keys", ["a", "b", "x"], "unknown feature 'x'"),
    ("sparse.keys", ["a", "b", "b"], "appears twice"),
    ("dense.raw", b"\x00" * 28, "expected 2 examples x 4 features = 8 floats, got 7"),
    (
        "dense.raw",
        torch.tensor([0, 0, 0, math.nan, 0, 0, 0, 0], dtype=torch.float32).numpy().tobytes(),
        "NaN or inf at example 0, feature 3",
    ),
    (
        "dense.raw",
        torch.tensor([0, 0, 0, 0, 0, math.inf, 0, 0], dtype=torch.float32).numpy().tobytes(),
        "example 1, feature 1",
    ),
    ("dense.data", [0.0] * 8, "set the typed field or dense.data_raw, not both"),
    ("sparse.weights_raw", b"\x00" * 20, "5 weights for 6 values"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD, ids=[f"{f}:{m[:24]}" for f, _, m in BAD])
def test_bad_input_names_the_field(field, value, message):
    req = good_request()
    _set(req, field, value)
    arrays_or_error = None
    with pytest.raises(InvalidRequestError, match=message) as info:
        arrays_or_error = decode_predict_request(req)
        check_request(arrays_or_error, schema(weighted=True))
    assert field.split(".")[0] in str(info.value) or "batch_size" in str(info.value)


def test_missing_feature_is_named():
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    with pytest.raises(InvalidRequestError, match="missing feature 'c'"):
        check_request(decode_predict_request(encode_predict_request(torch.zeros(1, 4), kjt)), schema())


def test_encode_raw_of_views_and_other_dtypes_matches_the_general_path():
    from recserve.server.dataplane.arrays import encode_raw

    scores = torch.arange(12, dtype=torch.float32) / 7
    for view in (*torch.split(scores, [5, 7]), scores[::3], scores.reshape(3, 4).t()):
        expected = np.ascontiguousarray(view.numpy()).astype("<f4").tobytes()
        assert encode_raw(view, "float32") == expected
    # Other dtypes and tensors that need grad take the general path: converted, detached.
    assert encode_raw(scores.double(), "float32") == scores.numpy().astype("<f4").tobytes()
    assert encode_raw(scores.clone().requires_grad_(), "float32") == scores.numpy().astype("<f4").tobytes()
    assert encode_raw(torch.tensor([1, -2]), "int32") == np.array([1, -2], dtype="<i4").tobytes()
