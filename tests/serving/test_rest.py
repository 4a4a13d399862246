"""The Open Inference Protocol over HTTP/REST against a real server, driven by ``requests`` and ``curl``."""

import json
import shutil
import struct
import subprocess
import threading

import numpy as np
import pytest
import requests
import torch

from recserve.runtime import Predictor

from .conftest import FEATURES, random_batch, running_server, scrape

HEADER = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def server(packages):
    with running_server(packages["1"], max_queue_delay_ms=1) as s:
        yield s


def url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.http_port}{path}"


def json_body(dense, kjt) -> dict:
    inputs = [{"name": "dense", "datatype": "FP32", "shape": list(dense.shape), "data": dense.tolist()}]
    for k in FEATURES:
        jt = kjt[k]
        lengths, values = jt.lengths().tolist(), jt.values().tolist()
        inputs.append({"name": f"{k}.lengths", "datatype": "INT32", "shape": [len(lengths)], "data": lengths})
        inputs.append({"name": f"{k}.values", "datatype": "INT64", "shape": [len(values)], "data": values})
    return {"id": "r1", "inputs": inputs}


def binary_body(dense, kjt, binary_output: bool) -> tuple[bytes, dict]:
    """The binary-tensor extension: JSON header, then every input's raw little-endian bytes."""
    arrays = [("dense", "FP32", list(dense.shape), dense.numpy().astype("<f4"))]
    for k in FEATURES:
        jt = kjt[k]
        arrays.append((f"{k}.lengths", "INT32", [dense.shape[0]], jt.lengths().numpy().astype("<i4")))
        arrays.append((f"{k}.values", "INT64", [jt.values().numel()], jt.values().numpy().astype("<i8")))
    inputs = [
        {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": a.nbytes}}
        for n, d, s, a in arrays
    ]
    doc = {"inputs": inputs, "outputs": [{"name": "scores", "parameters": {"binary_data": binary_output}}]}
    head = json.dumps(doc).encode()
    return head + b"".join(a.tobytes() for *_, a in arrays), {HEADER: str(len(head))}


def test_health_and_metadata(server):
    assert requests.get(url(server, "/v2/health/live"), timeout=10).json() == {"live": True}
    assert requests.get(url(server, "/v2/health/ready"), timeout=10).json() == {"ready": True}
    meta = requests.get(url(server, "/v2"), timeout=10).json()
    assert meta["name"] == "recserve" and "binary_tensor_data" in meta["extensions"]
    model = requests.get(url(server, "/v2/models/tiny"), timeout=10).json()
    assert model["versions"] == ["1"] and model["inputs"][0] == {
        "name": "dense",
        "datatype": "FP32",
        "shape": [-1, 4],
    }
    assert requests.get(url(server, "/v2/models/tiny/versions/1/ready"), timeout=10).status_code == 200
    config = requests.get(url(server, "/v2/models/tiny/config"), timeout=10).json()
    assert (
        config["max_batch_size"] == 512 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    )
    assert config["input"][0] == {"name": "dense", "data_type": "TYPE_FP32", "dims": [4]}


def test_json_infer_matches_the_in_process_predictor(server, package):
    dense, kjt = random_batch(5, seed=3)
    r = requests.post(url(server, "/v2/models/tiny/infer"), json=json_body(dense, kjt), timeout=10)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["model_name"], doc["model_version"], doc["id"]) == ("tiny", "1", "r1")
    out = doc["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"]) == ("scores", "FP32", [5])
    expected = Predictor.load(package).predict(dense, kjt)
    torch.testing.assert_close(torch.tensor(out["data"], dtype=torch.float32), expected)


@pytest.mark.parametrize("binary_output", [True, False])
def test_binary_tensor_extension(server, package, binary_output):
    dense, kjt = random_batch(4, seed=7)
    body, headers = binary_body(dense, kjt, binary_output)
    r = requests.post(url(server, "/v2/models/tiny/versions/1/infer"), data=body, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    expected = Predictor.load(package).predict(dense, kjt)
    if binary_output:
        n = int(r.headers[HEADER])
        doc = json.loads(r.content[:n])
        assert doc["outputs"][0]["parameters"] == {"binary_data_size": 16}
        scores = np.frombuffer(r.content[n:], dtype="<f4")
    else:
        scores = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)
    torch.testing.assert_close(torch.from_numpy(scores.copy()), expected)


def _mutations():
    def drop_data(doc):
        del doc["inputs"][0]["data"]

    def count(doc):
        doc["inputs"][2]["data"] = doc["inputs"][2]["data"][:-1]

    def floats_as_ids(doc):
        doc["inputs"][2]["data"] = [0.5] * len(doc["inputs"][2]["data"])

    def unknown_feature(doc):
        doc["inputs"][1]["name"], doc["inputs"][2]["name"] = "zz.lengths", "zz.values"

    def out_of_range(doc):
        doc["inputs"][2]["data"] = [10_000] * len(doc["inputs"][2]["data"])

    def bad_shape(doc):
        doc["inputs"][0]["shape"] = [2, -4]

    def no_inputs(doc):
        doc["inputs"] = []

    def int_overflow(doc):
        doc["inputs"][1]["data"] = [2**40] * len(doc["inputs"][1]["data"])

    def datatype_list(doc):  # found by scripts/fuzz_server.py: was a TypeError (500)
        doc["inputs"][0]["datatype"] = ["FP32"]

    def shape_beyond_int64(doc):  # found by scripts/fuzz_server.py: was a protobuf ValueError (500)
        doc["inputs"][0]["shape"] = [2, 10**30]

    return [
        ("drop_data", drop_data, "inputs['dense']: give 'data'"),
        ("count", count, "inputs['f0.values'].data"),
        ("floats_as_ids", floats_as_ids, "inputs['f0.values'].data: expected integers"),
        ("unknown_feature", unknown_feature, "'zz"),
        ("out_of_range", out_of_range, "outside its table's range"),
        ("bad_shape", bad_shape, "inputs['dense'].shape"),
        ("no_inputs", no_inputs, "inputs: expected a non-empty list"),
        ("int_overflow", int_overflow, "inputs['f0.lengths'].data: a value outside"),
        ("datatype_list", datatype_list, "inputs['dense'].datatype: expected one of"),
        ("shape_beyond_int64", shape_beyond_int64, "inputs['dense'].shape: expected a list of int64"),
    ]


@pytest.mark.parametrize(("name", "mutate", "field"), _mutations(), ids=[m[0] for m in _mutations()])
def test_bad_json_is_400_naming_the_field_and_the_next_request_is_served(server, name, mutate, field):
    dense, kjt = random_batch(2, seed=1, max_ids=3)
    doc = json_body(dense, kjt)
    mutate(doc)
    r = requests.post(url(server, "/v2/models/tiny/infer"), json=doc, timeout=10)
    assert r.status_code == 400 and field in r.json()["error"], r.text
    ok = requests.post(url(server, "/v2/models/tiny/infer"), json=json_body(dense, kjt), timeout=10)
    assert ok.status_code == 200


def test_bad_binary_bodies_are_400(server):
    dense, kjt = random_batch(2, seed=2)
    body, headers = binary_body(dense, kjt, True)
    cases = [
        (body, {HEADER: "999999"}, HEADER),
        (body + b"\x00" * 4, headers, "belong to no input"),
        (body[:-4], headers, "binary bytes are left"),
        (b"{not json", {}, "not valid JSON"),
    ]
    for data, hdrs, field in cases:
        r = requests.post(url(server, "/v2/models/tiny/infer"), data=data, headers=hdrs, timeout=10)
        assert r.status_code == 400 and field in r.json()["error"], (field, r.text)


def test_unknown_model_or_version_is_404(server):
    dense, kjt = random_batch(2, seed=1)
    for path in ("/v2/models/other/infer", "/v2/models/tiny/versions/9/infer"):
        r = requests.post(url(server, path), json=json_body(dense, kjt), timeout=10)
        assert r.status_code == 404 and "not served" in r.json()["error"]
    assert requests.get(url(server, "/v2/models/other"), timeout=10).status_code == 404
    assert requests.get(url(server, "/v2/models/other/ready"), timeout=10).status_code == 503
    assert requests.get(url(server, "/v2/no/such/path"), timeout=10).status_code == 404
    assert requests.get(url(server, "/v2/health/live"), timeout=10).status_code == 200
    counted = scrape(server)["recserve_requests_total"]
    assert counted[(("code", "NOT_FOUND"), ("method", "rest/ModelInfer"))] >= 2
    assert counted[(("code", "OK"), ("method", "rest/ServerLive"))] >= 1


def test_statistics_and_repository_over_rest(server):
    dense, kjt = random_batch(3, seed=4)
    requests.post(url(server, "/v2/models/tiny/infer"), json=json_body(dense, kjt), timeout=10)
    stats = requests.get(url(server, "/v2/models/tiny/stats"), timeout=10).json()["model_stats"][0]
    assert stats["name"] == "tiny" and stats["inference_count"] >= 3
    assert stats["inference_stats"]["compute_infer"]["count"] >= 1
    assert isinstance(stats["inference_stats"]["success"]["ns"], int)
    index = requests.post(url(server, "/v2/repository/index"), json={}, timeout=10).json()
    assert index == [{"name": "tiny", "version": "1", "state": "READY"}]


def test_a_full_worker_answers_429(package):
    """One admitted request holds the only slot (the batcher waits 3 s for more); the next is refused."""
    with running_server(package, max_inflight=1, grpc_threads=2, max_queue_delay_ms=3000) as s:
        dense, kjt = random_batch(2, seed=1)
        held = threading.Thread(
            target=requests.post,
            args=(url(s, "/v2/models/tiny/infer"),),
            kwargs={"json": json_body(dense, kjt)},
        )
        held.start()
        deadline = 0
        while s.admission.in_flight == 0 and deadline < 500:
            threading.Event().wait(0.01)
            deadline += 1
        r = requests.post(url(s, "/v2/models/tiny/infer"), json=json_body(dense, kjt), timeout=10)
        assert r.status_code == 429 and "--max-inflight" in r.json()["error"]
        assert requests.get(url(s, "/v2/health/ready"), timeout=10).status_code == 200  # probes exempt
        held.join(30)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_examples_from_the_readme_work(server, package):
    dense = [[0.1, 0.2, 0.3, 0.4]]
    doc = {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [1, 4], "data": dense}]}
    for k, ids in zip(FEATURES, ([3, 7], [42], [])):
        doc["inputs"].append({"name": f"{k}.lengths", "datatype": "INT32", "shape": [1], "data": [len(ids)]})
        doc["inputs"].append({"name": f"{k}.values", "datatype": "INT64", "shape": [len(ids)], "data": ids})
    out = subprocess.run(
        ["curl", "-s", "-X", "POST", url(server, "/v2/models/tiny/infer"),
         "-H", "Content-Type: application/json", "-d", json.dumps(doc)],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    score = json.loads(out)["outputs"][0]["data"][0]
    from recserve.client import kjt_from_lists

    kjt = kjt_from_lists({"f0": [[3, 7]], "f1": [[42]], "f2": [[]]})
    expected = Predictor.load(package).predict(torch.tensor(dense), kjt)
    assert struct.unpack("<f", struct.pack("<f", score))[0] == pytest.approx(float(expected[0]), abs=1e-6)
    ready = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url(server, "/v2/health/ready")],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert ready == "200"
