"""Requests decoded as parts and checked over their merged batch (issue 37) score exactly as each request
checked alone, and a request at fault in a batch gets the exact path's error while the others are scored."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recserve.client.oip_requests import infer_request
from recserve.errors import InvalidRequestError
from recserve.runtime import Predictor
from recserve.server.dataplane.batcher import BatcherConfig
from recserve.server.dataplane.core import InferenceCore
from recserve.server.dataplane.parts import RequestParts
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.dataplane.validation import check_request
from recserve.server.transports.codec import decode_predict_request, encode_predict_request
from recserve.server.transports.oip import decode_batchable, decode_infer_request
from recserve.server.transports.protos import oip_pb2, pb2
from recserve.server.transports.servicer import decode_batchable as decode_v1

from .conftest import random_batch
from .test_oip import infer_request as typed_infer_request


@pytest.fixture(scope="module")
def runner(packages):
    r = ModelRunner(Predictor.load(packages["1"]), BatcherConfig(max_batch_size=64))
    yield r
    r.close()


def _oip(dense, kjt, **dtypes: str) -> oip_pb2.ModelInferRequest:
    """The request with raw tensors; ``lengths="INT64"`` / ``values="INT32"`` send those in that datatype."""
    req = infer_request("tiny", dense, kjt)
    for i, t in enumerate(req.inputs):
        role = t.name.rsplit(".", 1)[-1]
        if role in dtypes and dtypes[role] != t.datatype:
            old, new = ("<i4", "<i8") if t.datatype == "INT32" else ("<i8", "<i4")
            t.datatype = dtypes[role]
            raw = np.frombuffer(req.raw_input_contents[i], old).astype(new).tobytes()
            req.raw_input_contents[i] = raw
    return oip_pb2.ModelInferRequest.FromString(req.SerializeToString())


def _alone(item, runner) -> torch.Tensor:
    """The scores of one item checked alone by its exact path."""
    checked = item.checked() if isinstance(item, RequestParts) else item
    dense, kjt = checked.dense, checked.kjt
    return runner.predictor.predict(dense, kjt)


def _v1(dense, kjt) -> pb2.PredictRequest:
    return pb2.PredictRequest.FromString(encode_predict_request(dense, kjt).SerializeToString())


def test_merged_parts_score_as_each_request_alone(runner):
    batches = [random_batch(b, seed=i) for i, b in enumerate([1, 4, 3, 7, 2])]
    items = [
        decode_batchable(_oip(*batches[0]), runner.schema, runner.oip_layout),
        decode_batchable(_oip(*batches[1], lengths="INT64"), runner.schema, runner.oip_layout),
        decode_batchable(_oip(*batches[2], values="INT32"), runner.schema, runner.oip_layout),
        decode_v1(_v1(*batches[3]), runner.schema),
        decode_v1(_v1(*batches[4]), runner.schema),
    ]
    assert all(isinstance(i, RequestParts) for i in items)
    out = runner._predict_batch(items, record=False)
    for item, scores, (dense, kjt) in zip(items, out, batches):
        assert torch.equal(scores, _alone(item, runner))
        torch.testing.assert_close(scores, runner.predictor.predict(dense, kjt), rtol=1e-5, atol=1e-6)


def _faults():
    """(name, OIP request at fault): each breaks what only the batch check sees."""
    dense, kjt = random_batch(3, seed=11)
    out_of_range = _oip(dense, kjt)
    values = np.frombuffer(out_of_range.raw_input_contents[2], "<i8").copy()
    values[-1] = 10_000  # feature f0's last id, beyond its 100 rows
    out_of_range.raw_input_contents[2] = values.tobytes()
    lengths_off = _oip(dense, kjt)  # one id moves from f2 to f1: the request's total still adds up
    f1, f2 = (np.frombuffer(lengths_off.raw_input_contents[i], "<i4").copy() for i in (3, 5))
    f1[0] += 1
    f2[int(np.flatnonzero(f2)[0])] -= 1
    lengths_off.raw_input_contents[3], lengths_off.raw_input_contents[5] = f1.tobytes(), f2.tobytes()
    nan = _oip(dense, kjt)
    d = np.frombuffer(nan.raw_input_contents[0], "<f4").copy()
    d[5] = np.nan
    nan.raw_input_contents[0] = d.tobytes()
    negative = _oip(dense, kjt, lengths="INT64")
    big = np.frombuffer(negative.raw_input_contents[1], "<i8").copy()
    big[:] = [2**62, 2**62, -(2**63)]  # sums to a small number in int64 arithmetic: bounded first
    negative.raw_input_contents[1] = big.tobytes()
    return {
        "id outside its table": out_of_range,
        "nan": nan,
        "int64 lengths that wrap": negative,
    }, lengths_off


@pytest.mark.parametrize("fault", ["id outside its table", "nan", "int64 lengths that wrap", "lengths sum"])
def test_a_request_at_fault_gets_the_exact_error_and_the_others_their_scores(runner, fault):
    faults, lengths_off = _faults()
    bad = lengths_off if fault == "lengths sum" else faults[fault]
    with pytest.raises(InvalidRequestError) as alone:
        check_request(decode_infer_request(bad, runner.schema), runner.schema)
    good = [
        decode_batchable(_oip(*random_batch(b, seed=20 + b)), runner.schema, runner.oip_layout)
        for b in (2, 5)
    ]
    item = decode_batchable(bad, runner.schema, runner.oip_layout)
    assert isinstance(item, RequestParts)  # its fault is one only the data shows
    out = runner._predict_batch([good[0], item, good[1]], record=False)
    assert isinstance(out[1], InvalidRequestError) and str(out[1]) == str(alone.value)
    for g, scores in zip(good, (out[0], out[2])):
        assert torch.equal(scores, _alone(g, runner))


def test_unusual_requests_take_the_exact_path(runner):
    dense, kjt = random_batch(2, seed=3)
    reordered = _v1(dense, kjt)
    reordered.sparse.keys[:] = list(reversed(reordered.sparse.keys))  # keys in another order than the model's
    typed = pb2.PredictRequest.FromString(encode_predict_request(dense, kjt, raw=False).SerializeToString())
    for request in (reordered, typed):
        assert not isinstance(decode_v1(request, runner.schema), RequestParts)
    oip_typed = typed_infer_request(dense, kjt, raw=False)
    assert not isinstance(decode_batchable(oip_typed, runner.schema, runner.oip_layout), RequestParts)


def test_a_batch_of_parts_and_checked_requests_is_scored(runner):
    """A request checked on arrival (the exact path) and parts merge into one batch."""
    a, b = random_batch(3, seed=31), random_batch(2, seed=32)
    checked = check_request(decode_predict_request(_v1(*a)), runner.schema)
    parts = decode_batchable(_oip(*b), runner.schema, runner.oip_layout)
    out = runner._predict_batch([checked, parts], record=False)
    torch.testing.assert_close(out[0], runner.predictor.predict(*a), rtol=1e-5, atol=1e-6)
    assert torch.equal(out[1], _alone(parts, runner))


def test_parts_cut_for_another_version_are_checked_against_the_serving_one(packages, runner):
    """A request decoded just before a reload meets the new runner, and is checked against its schema."""
    other = ModelRunner(Predictor.load(packages["2"]), BatcherConfig(max_batch_size=64))
    core = InferenceCore(other)
    try:
        dense, kjt = random_batch(2, seed=41)
        parts = decode_batchable(_oip(dense, kjt), runner.schema, runner.oip_layout)
        result = core.infer(parts, model_name="tiny")
        assert result.model_version == "2"
        torch.testing.assert_close(result.scores, other.predictor.predict(dense, kjt), rtol=1e-5, atol=1e-6)
    finally:
        core.close()
