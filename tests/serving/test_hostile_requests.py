"""The hostile-client findings of issue 33 against a real server: outputs that are not finite, ambiguous
inputs, empty model names, the ``timeout`` parameter, JSON nested to break the parser."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import requests
import torch

from recserve.errors import NonFiniteScoresError
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.batcher import BatcherConfig
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.dataplane.validation import check_request
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc

from .conftest import DENSE, random_batch, running_server, scrape, target
from .test_oip import infer_request
from .test_rest import json_body

FLT_MAX = float(np.finfo(np.float32).max)


@pytest.fixture(scope="module")
def server(packages):
    with running_server(packages["1"], max_queue_delay_ms=1) as s:
        yield s


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(target(server)) as channel:
        yield oip_pb2_grpc.GRPCInferenceServiceStub(channel)


def _rest(server, path: str, **kwargs) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{server.http_port}{path}", timeout=30, **kwargs)


def _poison(batch: int = 3) -> tuple[torch.Tensor, object]:
    dense, kjt = random_batch(batch, seed=5)
    dense[1] = torch.tensor([FLT_MAX, -FLT_MAX] * (DENSE // 2))  # finite, and far beyond float32 arithmetic
    return dense, kjt


def test_non_finite_scores_are_refused_for_the_requests_that_caused_them(packages):
    """Two requests in one batch: the one whose inputs blow the model up gets an error, the other scores."""

    class Probe:
        count = 0

        def inc(self) -> None:
            self.count += 1

    from recserve.runtime import Predictor

    probe = Probe()
    runner = ModelRunner(
        Predictor.load(packages["1"]), BatcherConfig(max_batch_size=64), on_nonfinite=probe.inc
    )
    try:
        poison, good = _poison(), random_batch(2, seed=6)
        requests_ = [check_request(_arrays(*batch), runner.schema) for batch in (poison, good)]
        out = runner._predict_batch(requests_)
        assert isinstance(out[0], NonFiniteScoresError) and "example(s) [1]" in str(out[0])
        assert isinstance(out[1], torch.Tensor) and bool(torch.isfinite(out[1]).all())
        assert torch.equal(out[1], runner.predictor.predict(*good))
        assert probe.count == 1
    finally:
        runner.close()


def _arrays(dense, kjt) -> FeatureArrays:
    return FeatureArrays(
        batch_size=dense.shape[0],
        dense=dense.reshape(-1),
        keys=list(kjt.keys()),
        lengths=kjt.lengths(),
        values=kjt.values(),
    )


def test_non_finite_scores_are_invalid_argument_on_every_api_and_counted(server, stub):
    before = scrape(server).get("recserve_nonfinite_scores_total", {}).get((), 0)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(infer_request(*_poison(), raw=True))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not finite" in info.value.details()
    reply = _rest(server, "/v2/models/tiny/infer", json=json_body(*_poison()))
    assert reply.status_code == 400 and "not finite" in reply.json()["error"]
    assert scrape(server)["recserve_nonfinite_scores_total"][()] == before + 2
    assert stub.ModelInfer(infer_request(*random_batch(2), raw=True)).model_version == "1"


def test_typed_contents_beside_raw_bytes_are_refused(stub):
    req = infer_request(*random_batch(2), raw=True)
    req.inputs[0].contents.fp32_contents.extend([0.0] * 2 * DENSE)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inputs['dense']: given both as contents and in raw_input_contents" in info.value.details()


def test_json_data_beside_binary_bytes_is_refused(server):
    dense, kjt = random_batch(2)
    doc = json_body(dense, kjt)
    raw = dense.numpy().astype("<f4").tobytes()
    doc["inputs"][0]["parameters"] = {"binary_data_size": len(raw)}  # and its "data" stays
    head = json.dumps(doc).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    reply = _rest(server, "/v2/models/tiny/infer", data=head + raw, headers=headers)
    assert reply.status_code == 400
    assert "inputs['dense']: given both as 'data' and as binary_data_size bytes" in reply.json()["error"]


@pytest.mark.parametrize(
    "call, request_",
    [
        ("ModelInfer", lambda: infer_request(*random_batch(1), raw=True)),
        ("ModelMetadata", lambda: oip_pb2.ModelMetadataRequest()),
        ("ModelConfig", lambda: oip_pb2.ModelConfigRequest()),
        ("ModelReady", lambda: oip_pb2.ModelReadyRequest()),
    ],
)
def test_empty_model_names_are_refused(stub, call, request_):
    req = request_()
    if call == "ModelInfer":
        req.model_name = ""
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, call)(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty" in info.value.details()


def test_the_timeout_parameter_is_a_deadline(server, stub):
    req = infer_request(*random_batch(2), raw=True)
    req.parameters["timeout"].int64_param = 1  # one microsecond: over before the request is queued
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    doc = {**json_body(*random_batch(2)), "parameters": {"timeout": 1}}
    assert _rest(server, "/v2/models/tiny/infer", json=doc).status_code == 504
    req.parameters["timeout"].int64_param = 30_000_000  # 30 s: plenty
    assert stub.ModelInfer(req).model_version == "1"


def test_json_nested_beyond_the_parser_is_400(server):
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    reply = _rest(server, "/v2/models/tiny/infer", data=deep)
    assert reply.status_code == 400 and "nested too deeply" in reply.json()["error"]
    for path in ("/v2/repository/index", "/v2/repository/models/tiny/load"):
        reply = _rest(server, path, data=b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        assert reply.status_code == 400, path
    assert _rest(server, "/v2/models/tiny/infer", json=json_body(*random_batch(1))).status_code == 200
