"""Property-based fuzzing of both services on a real server: one field broken at a time, never a crash.

Every broken request must answer INVALID_ARGUMENT (a valid one OK with one score per example), never INTERNAL
or UNKNOWN, and the server must answer the next valid request. Examples are kept few so CI stays fast; the
coverage-guided fuzzer (``scripts/fuzz_server.py``) runs longer.
"""

from __future__ import annotations

import os

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings

from recserve.server.transports.protos import oip_pb2_grpc, pb2_grpc

from .conftest import running_server, target
from .strategies import (
    broken_infer_requests,
    broken_predict_requests,
    infer_request,
    predict_request,
    valid_specs,
)

FUZZ = settings(
    max_examples=int(os.environ.get("RECSERVE_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def channel(packages):
    with (
        # Queue-lag shedding off: this checks decoding, and a stalled shared machine trips the 100 ms default.
        running_server(packages["1"], max_queue_delay_ms=1, max_queue_lag_ms=0) as server,
        grpc.insecure_channel(target(server)) as ch,
    ):
        yield ch


def _expect(call, what, request):
    event(str(what))
    try:
        resp = call(request, timeout=10)
    except grpc.RpcError as e:
        assert what is not None, f"valid request refused: {e.code()} {e.details()}"
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, e.code(), e.details())
        assert e.details()
        return
    assert what is None, f"{what}: accepted a broken request"
    return resp


@FUZZ
@given(case=broken_predict_requests(), after=valid_specs())
def test_predictor_answers_invalid_argument_to_each_broken_field_and_keeps_serving(channel, case, after):
    stub = pb2_grpc.PredictorStub(channel)
    what, req = case
    resp = _expect(stub.Predict, what, req)
    if resp is not None:
        assert len(resp.scores) + len(resp.scores_raw) // 4 == req.batch_size
    assert len(stub.Predict(predict_request(after, raw=True), timeout=10).scores_raw) == 4 * after.batch


@FUZZ
@given(case=broken_infer_requests(), after=valid_specs())
def test_oip_answers_invalid_argument_to_each_broken_field_and_keeps_serving(channel, case, after):
    stub = oip_pb2_grpc.GRPCInferenceServiceStub(channel)
    what, req = case
    resp = _expect(stub.ModelInfer, what, req)
    if resp is not None:
        assert list(resp.outputs[0].shape) == [req.inputs[0].shape[0]]
    assert list(stub.ModelInfer(infer_request(after, raw=True), timeout=10).outputs[0].shape) == [after.batch]
