"""Triton's own Python client (``tritonclient[grpc]``, the ``triton`` test extra) against a real server.

It needs protobuf < 7, so these tests run in the venv test.sh builds with ``.[test,triton]`` (and are skipped
where tritonclient is not installed). Every call tritonclient makes must work, and tritonclient and recserve's
own generated modules must live in one process (both define ``inference.*`` protobuf messages).
"""

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from recserve.client import PredictorClient

from .conftest import FEATURES, random_batch, running_server, target

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


def triton_inputs(dense, kjt) -> list:
    inputs = [grpcclient.InferInput("dense", list(dense.shape), "FP32")]
    inputs[0].set_data_from_numpy(dense.numpy())
    for k in FEATURES:
        jt = kjt[k]
        lengths = grpcclient.InferInput(f"{k}.lengths", [dense.shape[0]], "INT32")
        lengths.set_data_from_numpy(jt.lengths().numpy().astype(np.int32))
        values = grpcclient.InferInput(f"{k}.values", [jt.values().numel()], "INT64")
        values.set_data_from_numpy(jt.values().numpy())
        inputs += [lengths, values]
    return inputs


@pytest.fixture
def repo(packages, tmp_path):
    shutil.copytree(packages["1"], tmp_path / "tiny" / "1")
    return tmp_path / "tiny"


def test_tritonclient_drives_every_call(repo, packages):
    token = {"authorization": "Bearer s3cret"}
    with running_server(
        repo / "1", max_queue_delay_ms=1, model_control="explicit", admin_token="s3cret"
    ) as server:
        client = grpcclient.InferenceServerClient(target(server))
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny")
        assert "statistics" in client.get_server_metadata().extensions
        meta = client.get_model_metadata("tiny")
        assert meta.versions == ["1"] and meta.inputs[0].name == "dense"
        config = client.get_model_config("tiny").config
        assert config.max_batch_size == 512 and config.dynamic_batching.max_queue_delay_microseconds == 1000
        assert [i.name for i in config.input][:3] == ["dense", "f0.lengths", "f0.values"]

        dense, kjt = random_batch(6, seed=11)
        result = client.infer("tiny", triton_inputs(dense, kjt), request_id="t1", priority=1)
        with PredictorClient(target(server)) as ours:
            expected = ours.predict(dense, kjt)
        scores = torch.from_numpy(result.as_numpy("scores").copy())
        assert float((scores - expected).abs().max()) == 0.0
        assert result.get_response().id == "t1"

        stats = client.get_inference_statistics("tiny").model_stats[0]
        assert stats.inference_count == 12 and stats.inference_stats.success.count == 2  # theirs + ours
        assert stats.inference_stats.compute_infer.ns > 0 and stats.batch_stats[0].batch_size == 6

        index = client.get_model_repository_index().models
        assert [(m.name, m.version, m.state) for m in index] == [("tiny", "1", "READY")]
        with pytest.raises(InferenceServerException) as info:
            client.unload_model("tiny")  # without the admin token
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        assert client.is_model_ready("tiny")
        client.unload_model("tiny", headers=token)
        assert not client.is_model_ready("tiny")
        with pytest.raises(InferenceServerException) as info:
            client.infer("tiny", triton_inputs(dense, kjt))
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        shutil.copytree(packages["2"], repo / "2")
        client.load_model("tiny", headers=token)
        assert client.is_model_ready("tiny", "2")
        assert client.infer("tiny", triton_inputs(dense, kjt)).get_response().model_version == "2"


def test_tritonclient_sees_not_found_and_invalid_argument(packages):
    with running_server(packages["1"], max_queue_delay_ms=1, model_control="explicit") as server:
        client = grpcclient.InferenceServerClient(target(server))
        dense, kjt = random_batch(2, seed=1)
        for call in (
            lambda: client.infer("other", triton_inputs(dense, kjt)),
            lambda: client.infer("tiny", triton_inputs(dense, kjt), model_version="7"),
            lambda: client.get_model_config("other"),
            lambda: client.get_inference_statistics("other"),
            lambda: client.load_model("other"),
        ):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.NOT_FOUND", info.value.message()
        bad = triton_inputs(dense, kjt)
        bad[2] = grpcclient.InferInput("f0.values", [1], "INT64")
        bad[2].set_data_from_numpy(np.array([10_000], dtype=np.int64))
        with pytest.raises(InferenceServerException) as info:
            client.infer("tiny", bad)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "f0.values" in info.value.message()


_BOTH_IN_ONE_PROCESS = """
import sys
import tritonclient.grpc as grpcclient  # registers inference.* in protobuf's default pool
from recserve.client import PredictorClient, kjt_from_lists
from recserve.server.transports.protos import oip_pb2  # our inference.* messages: a private pool, no clash
import numpy as np, torch

target = sys.argv[1]
dense = [[0.5, -1.0, 2.0, 0.0]]
sparse = {"f0": [[3, 7]], "f1": [[42]], "f2": [[1, 2, 3]]}
ours = PredictorClient(target).predict_lists(dense, sparse)
inputs = [grpcclient.InferInput("dense", [1, 4], "FP32")]
inputs[0].set_data_from_numpy(np.asarray(dense, dtype=np.float32))
for f, ids in sparse.items():
    lengths = grpcclient.InferInput(f + ".lengths", [1], "INT32")
    lengths.set_data_from_numpy(np.asarray([len(ids[0])], dtype=np.int32))
    values = grpcclient.InferInput(f + ".values", [len(ids[0])], "INT64")
    values.set_data_from_numpy(np.asarray(ids[0], dtype=np.int64))
    inputs += [lengths, values]
theirs = grpcclient.InferenceServerClient(target).infer("tiny", inputs).as_numpy("scores").tolist()
assert oip_pb2.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
print(ours, theirs)
assert ours == theirs, (ours, theirs)
"""


def test_tritonclient_and_recserve_client_in_one_process(packages):
    """tritonclient imported first, then recserve.client, in a fresh interpreter; both round-trip."""
    with running_server(packages["1"], max_queue_delay_ms=1) as server:
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_BOTH_IN_ONE_PROCESS), target(server)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr[-3000:]


def test_tritonclient_calls_a_recommendation_pipeline(tmp_path):
    from recserve.recommend.pipeline import RecommendPipeline
    from tests.recommend.fixtures import make_pipeline, user_batch

    pipeline_dir = make_pipeline(tmp_path)
    dense, kjt = user_batch([17], seed=17)
    expected = RecommendPipeline.load(pipeline_dir).recommend(dense, kjt, k=6, exclude=[[1003]])[0]
    with running_server(pipeline_dir) as server:
        client = grpcclient.InferenceServerClient(target(server))
        assert client.is_model_ready("recommend")
        meta = client.get_model_metadata("recommend")
        assert [o.name for o in meta.outputs] == ["item_ids", "scores"]
        inputs = [grpcclient.InferInput("dense", list(dense.shape), "FP32")]
        inputs[0].set_data_from_numpy(dense.numpy())
        for name, data, dtype in (
            ("user.lengths", kjt.lengths().numpy().astype(np.int32), "INT32"),
            ("user.values", kjt.values().numpy(), "INT64"),
            ("exclude_item_ids", np.array([1003], dtype=np.int64), "INT64"),
        ):
            inputs.append(grpcclient.InferInput(name, list(data.shape), dtype))
            inputs[-1].set_data_from_numpy(data)
        outputs = [grpcclient.InferRequestedOutput("item_ids"), grpcclient.InferRequestedOutput("scores")]
        result = client.infer("recommend", inputs, outputs=outputs, parameters={"k": 6})
        assert result.as_numpy("item_ids").tolist() == expected.item_ids.tolist()
        np.testing.assert_allclose(result.as_numpy("scores"), expected.scores.numpy(), rtol=1e-6)
