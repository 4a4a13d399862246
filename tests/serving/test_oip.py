"""Open Inference Protocol v2 (KServe/Triton GRPCInferenceService) against a real server."""

import grpc
import numpy as np
import pytest
import torch

from recserve.runtime import Predictor
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc

from .conftest import FEATURES, random_batch, running_server, target


@pytest.fixture(scope="module")
def stub(packages):
    with running_server(packages["1"], max_queue_delay_ms=1) as server:
        yield oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(server)))


def infer_request(dense, kjt, raw: bool) -> oip_pb2.ModelInferRequest:
    req = oip_pb2.ModelInferRequest(model_name="tiny", id="q1")
    tensors = [("dense", "FP32", list(dense.shape), dense.numpy())]
    for k in FEATURES:
        jt = kjt[k]
        tensors.append((f"{k}.lengths", "INT32", [dense.shape[0]], jt.lengths().numpy().astype("<i4")))
        tensors.append((f"{k}.values", "INT64", [jt.values().numel()], jt.values().numpy().astype("<i8")))
    for name, dtype, shape, arr in tensors:
        t = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        elif dtype == "FP32":
            t.contents.fp32_contents.extend(arr.reshape(-1).tolist())
        elif dtype == "INT32":
            t.contents.int_contents.extend(arr.tolist())
        else:
            t.contents.int64_contents.extend(arr.tolist())
    return req


def test_health_and_metadata_rpcs(stub):
    assert stub.ServerLive(oip_pb2.ServerLiveRequest()).live
    assert stub.ServerReady(oip_pb2.ServerReadyRequest()).ready
    assert stub.ModelReady(oip_pb2.ModelReadyRequest(name="tiny")).ready
    assert not stub.ModelReady(oip_pb2.ModelReadyRequest(name="tiny", version="9")).ready
    assert stub.ServerMetadata(oip_pb2.ServerMetadataRequest()).name == "recserve"
    md = stub.ModelMetadata(oip_pb2.ModelMetadataRequest(name="tiny"))
    assert md.versions == ["1"]
    inputs = [(t.name, t.datatype, list(t.shape)) for t in md.inputs]
    assert inputs[0] == ("dense", "FP32", [-1, 4])
    assert ("f1.lengths", "INT32", [-1]) in inputs and ("f1.values", "INT64", [-1]) in inputs
    assert [(t.name, t.datatype) for t in md.outputs] == [("scores", "FP32")]


@pytest.mark.parametrize("raw", [True, False])
def test_model_infer_matches_the_in_process_predictor(stub, package, raw):
    dense, kjt = random_batch(5, seed=3)
    resp = stub.ModelInfer(infer_request(dense, kjt, raw))
    assert (resp.model_name, resp.model_version, resp.id) == ("tiny", "1", "q1")
    assert resp.outputs[0].name == "scores" and list(resp.outputs[0].shape) == [5]
    if raw:
        scores = np.frombuffer(resp.raw_output_contents[0], dtype="<f4")
    else:
        scores = np.asarray(resp.outputs[0].contents.fp32_contents, dtype=np.float32)
    torch.testing.assert_close(torch.from_numpy(scores.copy()), Predictor.load(package).predict(dense, kjt))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.raw_input_contents.__setitem__(2, b"\x00" * 3), "raw_input_contents['f0.values']"),
        (lambda r: setattr(r.inputs[1], "datatype", "FP32"), "datatype"),
        (lambda r: r.inputs[0].shape.__setitem__(1, 3), "raw_input_contents['dense']"),
        (
            lambda r: [setattr(r.inputs[i], "name", f"zz.{n}") for i, n in ((5, "lengths"), (6, "values"))],
            "'zz'",
        ),
    ],
    ids=["raw_size", "datatype", "dense_shape", "unknown_feature"],
)
def test_bad_infer_requests_are_invalid_argument(stub, mutate, message):
    dense, kjt = random_batch(2, seed=1)
    req = infer_request(dense, kjt, raw=True)
    mutate(req)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    assert stub.ModelInfer(infer_request(dense, kjt, raw=True)).outputs[0].shape == [2]


@pytest.mark.parametrize(
    ("name", "version", "field"),
    [("other", "", "model_name: 'other'"), ("tiny", "9", "model_version: '9'")],
    ids=["unknown_model", "unknown_version"],
)
def test_unknown_model_or_version_is_not_found(stub, name, version, field):
    """As Triton and KServe answer: NOT_FOUND naming what was asked for, on every per-model RPC."""
    dense, kjt = random_batch(2, seed=1)
    req = infer_request(dense, kjt, raw=True)
    req.model_name, req.model_version = name, version
    calls = [
        lambda: stub.ModelInfer(req),
        lambda: stub.ModelMetadata(oip_pb2.ModelMetadataRequest(name=name, version=version)),
        lambda: stub.ModelConfig(oip_pb2.ModelConfigRequest(name=name, version=version)),
        lambda: stub.ModelStatistics(oip_pb2.ModelStatisticsRequest(name=name, version=version)),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert field in info.value.details()
    assert not stub.ModelReady(oip_pb2.ModelReadyRequest(name=name, version=version)).ready
