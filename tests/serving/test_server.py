"""A real server on a free loopback port and the real client: batching, errors, limits, health, metrics."""

import threading
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recserve.client import PredictorClient
from recserve.runtime import Predictor
from recserve.server.transports.codec import encode_predict_request
from recserve.server.transports.protos import pb2, pb2_grpc

from .conftest import FEATURES, random_batch, running_server, scrape, target


def test_concurrent_requests_are_batched_and_each_caller_gets_its_own_scores(package):
    predictor = Predictor.load(package)
    batches = [random_batch(b, seed=i) for i, b in enumerate([1, 3, 2, 5, 4, 1, 2, 3])]
    with running_server(package, max_queue_delay_ms=200) as server:
        client = PredictorClient(target(server))
        results = [None] * len(batches)
        barrier = threading.Barrier(len(batches))

        def call(i):
            barrier.wait()
            results[i] = client.predict_response(*batches[i], request_id=f"r{i}")

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(batches))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = scrape(server)
    for i, (dense, kjt) in enumerate(batches):
        resp = results[i]
        assert resp.request_id == f"r{i}" and resp.model_name == "tiny" and resp.model_version == "1"
        got = torch.frombuffer(bytearray(resp.scores_raw), dtype=torch.float32)
        torch.testing.assert_close(got, predictor.predict(dense, kjt), rtol=1e-5, atol=1e-6)
    assert max(r.timings.executed_batch_size for r in results) > max(d.shape[0] for d, _ in batches)
    count = metrics["recserve_batch_size_count"][()]
    total = metrics["recserve_batch_size_sum"][()]
    assert (
        total == sum(d.shape[0] for d, _ in batches) and total / count > 1
    )  # merged: mean batch > 1 request


def test_typed_fields_and_plain_lists_give_the_same_scores(package):
    dense, kjt = random_batch(3, seed=7)
    with running_server(package, max_queue_delay_ms=0) as server:
        raw = PredictorClient(target(server)).predict(dense, kjt)
        typed = PredictorClient(target(server), raw=False).predict(dense, kjt)
        sparse = {k: [jt.tolist() for jt in kjt[k].to_dense()] for k in FEATURES}
        lists = PredictorClient(target(server)).predict_lists(dense.tolist(), sparse)
    assert torch.equal(raw, typed)
    torch.testing.assert_close(torch.tensor(lists), raw)


def test_a_max_batch_smaller_than_the_warm_up_batch_starts_and_serves(package):
    dense, kjt = random_batch(2, seed=3)
    with running_server(package, max_batch_size=2) as server:
        scores = PredictorClient(target(server)).predict(dense, kjt)
    torch.testing.assert_close(scores, Predictor.load(package).predict(dense, kjt))


def test_deadline_exceeded_in_the_queue_is_dropped_before_compute(package):
    with running_server(package, max_queue_delay_ms=400) as server:
        client = PredictorClient(target(server))
        with pytest.raises(grpc.RpcError) as info:
            client.predict(*random_batch(2), timeout=0.1)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(0.6)  # the batcher reaches the request, finds it expired, drops it
        metrics = scrape(server)
    key = (("code", "DEADLINE_EXCEEDED"), ("method", "recserve.v1.Predictor/Predict"))
    assert metrics["recserve_requests_total"][key] == 1
    assert metrics["recserve_batch_size_count"][()] == 0  # nothing was computed


def test_full_queue_answers_resource_exhausted_at_once(package):
    # Two admitted at once, so that the second finds the batcher's queue (of one) full.
    with running_server(package, max_queue_delay_ms=3000, max_queue_size=1, max_inflight=2) as server:
        stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(server)))
        req = encode_predict_request(*random_batch(1))
        first = stub.Predict.future(req, timeout=10)
        time.sleep(0.2)  # the first request waits in the queue (delay 3 s)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(req, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_queue_size=1" in info.value.details()
        assert time.monotonic() - start < 1.5  # refused at once, not after the first request's 3 s wait
        assert len(first.result().scores_raw) == 4


def _mutations():
    """(name, mutate(request)) pairs, each making a request invalid in one field."""

    def setter(path, value):
        def mutate(req):
            *parents, leaf = path.split(".")
            msg = req
            for p in parents:
                msg = getattr(msg, p)
            if isinstance(value, list):
                del getattr(msg, leaf)[:]
                getattr(msg, leaf).extend(value)
            else:
                setattr(msg, leaf, value)

        return mutate

    one, two, nine = (1).to_bytes(4, "little"), (2).to_bytes(4, "little"), (9).to_bytes(4, "little")
    nan = torch.tensor([float("nan")] * 8, dtype=torch.float32).numpy().tobytes()
    return [
        ("lengths_do_not_sum", setter("sparse.lengths_raw", two + one * 5), "sparse.values"),
        ("length_over_values", setter("sparse.lengths_raw", nine + one * 5), "sparse.lengths: length 9"),
        ("lengths_count", setter("sparse.lengths_raw", one * 5), "sparse.lengths"),
        ("unknown_feature", setter("sparse.keys", ["f0", "f1", "zz"]), "unknown feature 'zz'"),
        ("missing_feature", setter("sparse.keys", ["f0", "f1"]), "missing feature 'f2'"),
        ("id_out_of_range", setter("sparse.values_raw", (1000).to_bytes(8, "little") * 6), "outside"),
        ("dense_width", setter("dense.raw", b"\x00" * 12), "dense: expected 2 examples x 4 features"),
        ("nan_dense", setter("dense.raw", nan), "NaN or inf"),
        ("batch_over_limit", setter("batch_size", 10_000), "max_batch_size"),
        ("empty_request", setter("batch_size", 0), "empty request"),
        ("raw_bytes_length", setter("sparse.values_raw", b"\x00" * 13), "not a multiple of 8"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def shared_server(packages):
    with running_server(packages["1"], max_queue_delay_ms=1) as server:
        yield server


@pytest.mark.parametrize(("name", "mutate", "message"), _mutations(), ids=[m[0] for m in _mutations()])
def test_bad_input_is_invalid_argument_and_the_next_request_succeeds(shared_server, name, mutate, message):
    kjt_dense = random_batch(2, max_ids=1)
    dense, kjt = kjt_dense
    kjt = type(kjt)(
        keys=FEATURES, values=torch.tensor([1, 2, 3, 4, 5, 6]), lengths=torch.ones(6, dtype=torch.int64)
    )
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(shared_server)))
    req = encode_predict_request(dense, kjt)
    mutate(req)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert message in info.value.details()
    assert len(stub.Predict(encode_predict_request(dense, kjt), timeout=10).scores_raw) == 8


def test_health_and_metadata(shared_server):
    channel = grpc.insecure_channel(target(shared_server))
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "recserve.v1.Predictor"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    md = PredictorClient(target(shared_server)).metadata()
    assert (md.model_name, md.version, md.dense_in_features, md.max_batch_size) == ("tiny", "1", 4, 512)
    assert [(f.name, f.num_embeddings, f.dtype) for f in md.features] == [
        ("f0", 100, "int8"), ("f1", 150, "int8"), ("f2", 200, "int8")
    ]  # fmt: skip


def test_metrics_page_has_every_documented_metric(shared_server):
    client = PredictorClient(target(shared_server))
    client.predict(*random_batch(3))
    m = scrape(shared_server)
    for name in (
        "recserve_requests_total",
        "recserve_request_latency_seconds_bucket",
        "recserve_queue_depth",
        "recserve_queue_wait_seconds_bucket",
        "recserve_batch_size_bucket",
        "recserve_inference_seconds_bucket",
        "recserve_inflight_requests",
        "recserve_examples_total",
    ):
        assert name in m, name
    assert m["recserve_model_info"][(("model", "tiny"), ("version", "1"))] == 1
    ok = (("code", "OK"), ("method", "recserve.v1.Predictor/Predict"))
    assert m["recserve_requests_total"][ok] >= 1
    buckets = {dict(k)["le"] for k in m["recserve_request_latency_seconds_bucket"]}
    assert {"0.0001", "0.025"} <= buckets  # sub-millisecond resolution and a boundary at the latency goal


def test_message_size_limit(package):
    with running_server(package, max_message_bytes=1024) as server:
        with pytest.raises(grpc.RpcError) as info:
            PredictorClient(target(server)).predict(*random_batch(64, max_ids=5))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_server_binds_loopback_by_default():
    from recserve.server.operations.config import ServeConfig

    assert ServeConfig(package="x").host == "127.0.0.1"


@st.composite
def fuzzed_requests(draw):
    b = draw(st.integers(-1, 5))
    keys = draw(st.lists(st.sampled_from([*FEATURES, "zz"]), max_size=4))
    n_lengths = draw(st.sampled_from([max(b, 0) * len(keys), draw(st.integers(0, 12))]))
    lengths = draw(st.lists(st.integers(-1, 3), min_size=n_lengths, max_size=n_lengths))
    n_values = draw(st.sampled_from([max(sum(lengths), 0), draw(st.integers(0, 12))]))
    values = draw(st.lists(st.integers(-3, 250), min_size=n_values, max_size=n_values))
    n_dense = draw(st.sampled_from([max(b, 0) * 4, draw(st.integers(0, 12))]))
    dense = draw(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=n_dense, max_size=n_dense)
    )
    req = pb2.PredictRequest(batch_size=b)
    req.sparse.keys.extend(keys)
    if draw(st.booleans()):
        req.sparse.lengths.extend(lengths), req.sparse.values.extend(values), req.dense.data.extend(dense)
    else:
        req.sparse.lengths_raw = torch.tensor(lengths, dtype=torch.int32).numpy().tobytes()
        req.sparse.values_raw = torch.tensor(values, dtype=torch.int64).numpy().tobytes()
        req.dense.raw = torch.tensor(dense, dtype=torch.float32).numpy().tobytes()
    return req


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(req=fuzzed_requests())
def test_fuzzed_requests_get_scores_or_invalid_argument(shared_server, req):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(shared_server)))
    try:
        resp = stub.Predict(req, timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    else:
        assert len(resp.scores) == req.batch_size
    assert len(stub.Predict(encode_predict_request(*random_batch(1)), timeout=10).scores_raw) == 4


def test_another_models_name_is_not_found_and_counted(shared_server):
    dense, kjt = random_batch(2, seed=5)
    req = encode_predict_request(dense, kjt, model_name="other")
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(shared_server)))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "model_name: 'other' is not served here (serving 'tiny')" in info.value.details()
    counted = scrape(shared_server)["recserve_requests_total"]
    assert counted[(("code", "NOT_FOUND"), ("method", "recserve.v1.Predictor/Predict"))] >= 1


def test_a_serving_process_takes_what_its_imports_made_out_of_the_cyclic_collectors_reach():
    """A full collection would otherwise traverse the ~350k objects of torch's, the engine's and gRPC's
    modules each time, stopping every thread for up to a second on a loaded machine (issue 43)."""
    import gc

    from recserve.server.operations import app

    def tracked(obj) -> bool:
        return any(o is obj for o in gc.get_objects())

    assert tracked(app.__dict__) and tracked(torch.nn.Module)
    try:
        app.freeze_imports()  # run_server's first step
        assert not tracked(app.__dict__) and not tracked(torch.nn.Module)
        assert gc.get_freeze_count() > 0
        fresh = [[]]  # made after the freeze: still collected as usual
        assert tracked(fresh)
    finally:
        gc.unfreeze()  # this test process goes on as it was
