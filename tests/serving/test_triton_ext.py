"""Triton's gRPC extensions (model configuration, statistics, model repository) against a real server.

``test_tritonclient.py`` drives the same calls through Triton's own client; these check what the answers mean.
"""

import shutil

import grpc
import pytest

from recserve.client import PredictorClient
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc

from .conftest import FEATURES, random_batch, running_server, target
from .test_oip import infer_request


def _stub(server):
    return oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(server)))


def _health(server) -> dict[str, str]:
    with PredictorClient(target(server)) as client:
        return {name: client.health(name) for name in ("", "recserve.v1.Predictor")}


def test_model_config_is_triton_shaped(package):
    with running_server(package, max_batch_size=256, max_queue_delay_ms=3, max_queue_size=100) as server:
        cfg = _stub(server).ModelConfig(oip_pb2.ModelConfigRequest(name="tiny")).config
    assert (cfg.name, cfg.platform, cfg.backend, cfg.max_batch_size) == (
        "tiny",
        "recserve_fbgemm",
        "recserve",
        256,
    )
    inputs = {i.name: i for i in cfg.input}
    assert list(inputs) == ["dense"] + [f"{f}.{r}" for f in FEATURES for r in ("lengths", "values")]
    assert (inputs["dense"].data_type, list(inputs["dense"].dims)) == (oip_pb2.TYPE_FP32, [4])
    assert (inputs["f0.lengths"].data_type, list(inputs["f0.lengths"].dims)) == (oip_pb2.TYPE_INT32, [])
    assert inputs["f0.values"].data_type == oip_pb2.TYPE_INT64 and inputs["f0.values"].allow_ragged_batch
    assert not inputs["dense"].allow_ragged_batch
    assert [(o.name, o.data_type) for o in cfg.output] == [("scores", oip_pb2.TYPE_FP32)]
    assert cfg.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 3000
    assert cfg.dynamic_batching.default_queue_policy.max_queue_size == 100
    assert cfg.instance_group[0].kind == oip_pb2.ModelInstanceGroup.KIND_CPU
    assert cfg.parameters["model_version"].string_value == "1"


def test_statistics_count_what_was_served(package):
    with running_server(package, max_queue_delay_ms=1) as server:
        stub = _stub(server)
        before = stub.ModelStatistics(oip_pb2.ModelStatisticsRequest(name="tiny")).model_stats[0]
        assert (before.inference_count, before.execution_count) == (0, 0)  # warm-up is not counted
        for i, batch in enumerate((3, 5, 2)):
            stub.ModelInfer(infer_request(*random_batch(batch, seed=i), raw=True))
        bad = infer_request(*random_batch(2, seed=9), raw=True)
        bad.raw_input_contents[2] = b"\x00" * 3
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(bad)  # refused while decoding: never reached the model
        ids_out_of_range = infer_request(*random_batch(2, seed=9), raw=True)
        ids_out_of_range.raw_input_contents[2] = (10_000).to_bytes(8, "little") * (
            len(ids_out_of_range.raw_input_contents[2]) // 8
        )
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(ids_out_of_range)  # refused by the model's schema check: a failure
        every = stub.ModelStatistics(oip_pb2.ModelStatisticsRequest()).model_stats
    assert len(every) == 1
    s = every[0]
    assert (s.name, s.version, s.inference_count) == ("tiny", "1", 10)
    st = s.inference_stats
    assert st.success.count == 3 and st.queue.count == 3 and st.fail.count == 1
    assert sum(b.compute_infer.count for b in s.batch_stats) == s.execution_count >= 1
    assert sum(b.batch_size * b.compute_infer.count for b in s.batch_stats) == 10
    # A request's compute time is its batch's: requests >= batches, request totals >= batch totals.
    for stage in ("compute_input", "compute_infer", "compute_output"):
        per_request = getattr(st, stage)
        assert per_request.count == 3
        assert per_request.ns >= sum(getattr(b, stage).ns for b in s.batch_stats) > 0
    # Each request's end-to-end time holds its queue wait and its batch's compute.
    inside = st.queue.ns + st.compute_input.ns + st.compute_infer.ns + st.compute_output.ns
    assert st.success.ns >= inside
    assert s.last_inference > 1_600_000_000_000  # ms since the epoch


def test_repository_unload_then_load_serves_the_newest_version(packages, tmp_path):
    repo = tmp_path / "tiny"
    shutil.copytree(packages["1"], repo / "1")
    dense, kjt = random_batch(2, seed=1)
    with running_server(repo / "1", max_queue_delay_ms=1, model_control="explicit") as server:
        stub = _stub(server)
        index = stub.RepositoryIndex(oip_pb2.RepositoryIndexRequest()).models
        assert [(m.name, m.version, m.state) for m in index] == [("tiny", "1", "READY")]
        stub.RepositoryModelUnload(oip_pb2.RepositoryModelUnloadRequest(model_name="tiny"))
        assert not stub.ModelReady(oip_pb2.ModelReadyRequest(name="tiny")).ready
        assert _health(server) == {"": "SERVING", "recserve.v1.Predictor": "NOT_SERVING"}  # alive, not ready
        assert stub.ServerLive(oip_pb2.ServerLiveRequest()).live
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(infer_request(dense, kjt, raw=True))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "unloaded" in info.value.details()
        index = stub.RepositoryIndex(oip_pb2.RepositoryIndexRequest()).models
        assert [(m.name, m.state, m.reason) for m in index] == [("tiny", "UNAVAILABLE", "unloaded")]
        assert not stub.RepositoryIndex(oip_pb2.RepositoryIndexRequest(ready=True)).models
        shutil.copytree(packages["2"], repo / "2")
        stub.RepositoryModelLoad(oip_pb2.RepositoryModelLoadRequest(model_name="tiny"))
        assert stub.ModelReady(oip_pb2.ModelReadyRequest(name="tiny", version="2")).ready
        assert stub.ModelInfer(infer_request(dense, kjt, raw=True)).model_version == "2"
        assert _health(server) == {"": "SERVING", "recserve.v1.Predictor": "SERVING"}
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(oip_pb2.RepositoryModelLoadRequest(model_name="other"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        load = oip_pb2.RepositoryModelLoadRequest(model_name="tiny")
        load.parameters["config"].string_param = "{}"
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(load)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "parameters['config']" in str(
            info.value.details()
        )


def test_explicit_load_and_unload_are_refused_under_watch(packages, tmp_path):
    shutil.copytree(packages["1"], tmp_path / "1")
    with running_server(None, watch=tmp_path, watch_interval_s=0.2) as server:
        stub = _stub(server)
        for call in (stub.RepositoryModelLoad, stub.RepositoryModelUnload):
            request_type = (
                oip_pb2.RepositoryModelLoadRequest
                if call is stub.RepositoryModelLoad
                else oip_pb2.RepositoryModelUnloadRequest
            )
            with pytest.raises(grpc.RpcError) as info:
                call(request_type(model_name="tiny"))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "polling is enabled" in info.value.details()
        assert stub.ModelReady(oip_pb2.ModelReadyRequest(name="tiny")).ready
