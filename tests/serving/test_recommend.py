"""Recommend served: gRPC (recserve.v1), REST and the OIP model give the offline pipeline's results."""

from __future__ import annotations

import json
import urllib.request

import grpc
import pytest
import torch

from recserve.errors import OverloadedError
from recserve.recommend.pipeline import RecommendPipeline
from recserve.server.dataplane.arrays import encode_raw
from recserve.server.dataplane.recommend import RecommendService
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc, pb2, pb2_grpc
from tests.recommend.fixtures import make_pipeline, user_batch
from tests.serving.conftest import running_server, scrape, target


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    return make_pipeline(tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def server(pipeline_dir):
    with running_server(pipeline_dir) as s:
        yield s


@pytest.fixture(scope="module")
def offline(pipeline_dir):
    return RecommendPipeline.load(pipeline_dir)


def recommend_request(user: int, **fields) -> pb2.RecommendRequest:
    dense, kjt = user_batch([user], seed=user)
    req = pb2.RecommendRequest(request_id=f"u{user}", **fields)
    req.dense.raw = encode_raw(dense, "float32")
    req.sparse.keys.extend(kjt.keys())
    req.sparse.lengths_raw = encode_raw(kjt.lengths(), "int32")
    req.sparse.values_raw = encode_raw(kjt.values(), "int64")
    return req


def expected(offline, user: int, k: int, exclude=()):
    dense, kjt = user_batch([user], seed=user)
    return offline.recommend(dense, kjt, k=k, exclude=[list(exclude)])[0]


def test_grpc_recommend_equals_the_offline_pipeline(server, offline):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(server)))
    for user in (0, 7, 31):
        resp = stub.Recommend(recommend_request(user, k=8), timeout=30)
        want = expected(offline, user, 8)
        assert list(resp.item_ids) == want.item_ids.tolist() and resp.request_id == f"u{user}"
        torch.testing.assert_close(torch.tensor(list(resp.scores)), want.scores)
        assert resp.candidates == 50 and resp.model_name == "recommend"
    # The excluded ids never come back, wherever they were in the top-k.
    top = list(stub.Recommend(recommend_request(3, k=10), timeout=30).item_ids)
    resp = stub.Recommend(recommend_request(3, k=10, exclude_item_ids=top[::2]), timeout=30)
    assert not set(resp.item_ids) & set(top[::2])
    assert list(resp.item_ids) == expected(offline, 3, 10, top[::2]).item_ids.tolist()


def test_grpc_recommend_refuses_bad_inputs_by_name(server):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(server)))
    cases = [
        (recommend_request(1, k=51), "k: 51 is outside [1, 50]"),
        (recommend_request(1, num_candidates=401), "num_candidates: 401"),
        (recommend_request(50), "user"),  # id outside the user table
    ]
    wrong_key = recommend_request(1)
    wrong_key.sparse.keys[0] = "genre"
    cases.append((wrong_key, "sparse.keys: unknown feature 'genre'"))
    for request, message in cases:
        with pytest.raises(grpc.RpcError) as error:
            stub.Recommend(request, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.value.details()


def test_scoring_still_serves_the_ranking_package(server):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(server)))
    assert stub.ModelMetadata(pb2.ModelMetadataRequest(), timeout=30).model_name == "ranker"


def oip_request(user: int, k: int, exclude=()) -> oip_pb2.ModelInferRequest:
    dense, kjt = user_batch([user], seed=user)
    req = oip_pb2.ModelInferRequest(model_name="recommend", id=f"u{user}")
    req.parameters["k"].int64_param = k
    for name, dtype, shape, data in (
        ("dense", "FP32", [1, 2], dense),
        ("user.lengths", "INT32", [1], kjt.lengths()),
        ("user.values", "INT64", [1], kjt.values()),
        ("exclude_item_ids", "INT64", [len(exclude)], torch.tensor(list(exclude), dtype=torch.int64)),
    ):
        req.inputs.add(name=name, datatype=dtype, shape=shape)
        req.raw_input_contents.append(
            encode_raw(data, {"FP32": "float32", "INT32": "int32"}.get(dtype, "int64"))
        )
    return req


def test_oip_model_infer_equals_the_offline_pipeline(server, offline):
    stub = oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(server)))
    meta = stub.ModelMetadata(oip_pb2.ModelMetadataRequest(name="recommend"), timeout=30)
    assert [o.name for o in meta.outputs] == ["item_ids", "scores"]
    resp = stub.ModelInfer(oip_request(9, 6, exclude=[1001]), timeout=30)
    want = expected(offline, 9, 6, [1001])
    assert [o.name for o in resp.outputs] == ["item_ids", "scores"]
    ids = torch.frombuffer(bytearray(resp.raw_output_contents[0]), dtype=torch.int64)
    scores = torch.frombuffer(bytearray(resp.raw_output_contents[1]), dtype=torch.float32)
    assert ids.tolist() == want.item_ids.tolist()
    torch.testing.assert_close(scores, want.scores)


def test_rest_infer_equals_the_offline_pipeline(server, offline):
    dense, kjt = user_batch([12], seed=12)
    doc = {
        "parameters": {"k": 5},
        "inputs": [
            {"name": "dense", "datatype": "FP32", "shape": [1, 2], "data": dense.reshape(-1).tolist()},
            {"name": "user.lengths", "datatype": "INT32", "shape": [1], "data": [1]},
            {"name": "user.values", "datatype": "INT64", "shape": [1], "data": [12]},
        ],
    }
    url = f"http://127.0.0.1:{server.http_port}/v2/models/recommend/infer"
    request = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=30).read())
    outputs = {o["name"]: o["data"] for o in reply["outputs"]}
    want = expected(offline, 12, 5)
    assert outputs["item_ids"] == want.item_ids.tolist()
    torch.testing.assert_close(torch.tensor(outputs["scores"]), want.scores)


def test_metrics_show_each_stage_and_the_candidates(server):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(server)))
    stub.Recommend(recommend_request(2, k=3), timeout=30)
    metrics = scrape(server)
    stages = {dict(k)["stage"] for k in metrics["recserve_recommend_stage_seconds_count"]}
    assert stages == {"query", "retrieval", "ranking"}
    assert sum(metrics["recserve_recommend_candidates_sum"].values()) >= 50
    counts = metrics["recserve_requests_total"]
    assert any(dict(k)["method"].endswith("Recommend") and dict(k)["code"] == "OK" for k in counts)


def test_admission_refuses_a_request_queued_behind_too_much_work(offline):
    # A batch waits up to 30 s to fill, so the first request is still queued when the second arrives.
    service = RecommendService(offline, max_queue_delay_s=30.0, max_queued_s=1e-6)
    dense, kjt = user_batch([1])
    user = offline.check(dense, kjt)[0]
    try:
        service._run([user])  # one batch through the service's batch function measures its pace
        first = service.submit(user)  # an idle queue takes a request whatever its size
        with pytest.raises(OverloadedError, match="50 candidates are queued ahead"):
            service.submit(user)
    finally:
        service.close(timeout=60)  # runs the queued request
    assert first.result(60).result.candidates == 50
