"""Our request deserialisers: undecodable bytes become a marker, and the log gets one line per interval."""

from __future__ import annotations

import logging
import time

import pytest

from recserve.errors import InvalidRequestError
from recserve.server.transports.handlers import DecodeFailureLog, UndecodableRequest, method_handlers
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc, pb2


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_are_logged_once_per_interval_with_the_count_since_the_last_line(caplog):
    clock = Clock()
    log = DecodeFailureLog(interval_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="recserve.server.transports.handlers"):
        log.record("/m", "bad")  # the first is logged at once
        for t in (1.0, 2.0, 59.0):
            clock.now = t
            log.record("/m", "bad")
        clock.now = 61.0
        log.record("/m", "worse")
        clock.now = 62.0
        log.record("/m", "again")  # counted; the interval's timer (here: flush) logs it
        log.flush()
        log.flush()  # nothing new: no line
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("1 undecodable request(s)")
    assert lines[1].startswith("4 undecodable request(s)") and lines[1].endswith("/m: worse")
    assert lines[2].startswith("1 undecodable request(s)") and lines[2].endswith("/m: again")


def test_a_burst_that_stops_is_still_reported_when_its_interval_ends(caplog):
    log = DecodeFailureLog(interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger="recserve.server.transports.handlers"):
        for _ in range(5):
            log.record("/m", "bad")
        deadline = time.monotonic() + 5
        while len(caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [r.getMessage()[:2] for r in caplog.records] == ["1 ", "4 "]


class Echo:
    def Predict(self, request, context):
        return request

    def ModelMetadata(self, request, context):
        return request

    def Recommend(self, request, context):
        return request


def test_handlers_parse_valid_messages_and_turn_garbage_into_invalid_argument():
    handlers = method_handlers(pb2, "Predictor", Echo(), DecodeFailureLog())
    assert set(handlers) == {"Predict", "ModelMetadata", "Recommend"}
    predict = handlers["Predict"]
    req = pb2.PredictRequest(batch_size=3, request_id="r")
    parsed = predict.request_deserializer(req.SerializeToString())
    assert predict.unary_unary(parsed, None) == req
    assert (
        predict.response_serializer(pb2.PredictResponse(request_id="x"))
        == pb2.PredictResponse(request_id="x").SerializeToString()
    )
    garbage = predict.request_deserializer(b"\x0a\xff\xff\xff\xff\x0f")
    assert isinstance(garbage, UndecodableRequest) and garbage.message_type == "recserve.v1.PredictRequest"
    with pytest.raises(
        InvalidRequestError, match="/recserve.v1.Predictor/Predict: the request is not a valid"
    ):
        predict.unary_unary(garbage, None)


def test_every_oip_method_gets_a_handler():
    names = {m.name for m in oip_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    servicer = oip_pb2_grpc.GRPCInferenceServiceServicer()
    assert set(method_handlers(oip_pb2, "GRPCInferenceService", servicer, DecodeFailureLog())) == names
