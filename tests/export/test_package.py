"""Model packages: round trip, manifest contents, placement independence, accuracy gate, named file errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from recserve.errors import AccuracyError, ExportError, PackageError
from recserve.export import export_package, synthetic_sample
from recserve.export.quantize import dequantize_table, quantize_table
from recserve.runtime import Predictor, read_manifest
from recserve.runtime.package import FORMAT_VERSION
from tests.export.common import dlrm_config, fp32_logits, request, trained_state

CFG = dlrm_config()
STATE = trained_state(CFG)
SAMPLE = synthetic_sample(CFG, num_examples=512)


def _export(path, **kwargs):
    kwargs.setdefault("accuracy_sample", SAMPLE)
    return export_package(path, model_config=CFG, state_dict=STATE, **kwargs)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("pkg") / "int8", source={"checkpoint": "/ckpt", "step": 7})


def _dequantized_state(dtype: str) -> dict:
    """STATE with every table replaced by what its quantized rows dequantize to."""
    state = dict(STATE)
    for key, value in STATE.items():
        if "embedding_bags" in key:
            state[key] = dequantize_table(quantize_table(value, dtype))
    return state


def test_round_trip_reproduces_the_dequantized_model(package):
    predictor = Predictor.load(package)
    dense, kjt = request(CFG, batch=33)
    expected = torch.sigmoid(fp32_logits(CFG, _dequantized_state("int8"), dense, kjt))
    torch.testing.assert_close(predictor.predict(dense, kjt), expected, rtol=1e-5, atol=1e-6)
    fp32 = torch.sigmoid(fp32_logits(CFG, STATE, dense, kjt))
    assert (predictor.predict(dense, kjt) - fp32).abs().max() < 0.02


def test_manifest_records_what_the_server_needs(package):
    manifest = read_manifest(package)
    raw = json.loads((package / "manifest.json").read_text())
    assert raw["format"] == "recserve-model-package" and raw["format_version"] == FORMAT_VERSION
    assert raw["model_config"] == CFG.to_dict()
    assert manifest.feature_names == ["f0", "f1", "g1", "f2", "f3"]
    assert manifest.dense_in_features == 5 and manifest.dense_dtype == "fp32"
    assert [(t.name, t.dtype.value, t.nbytes) for t in manifest.tables] == [
        (t.name, "int8", t.num_embeddings * (8 + 4)) for t in CFG.tables
    ]
    assert manifest.placement.devices == ["cpu"]
    assert manifest.source["step"] == 7 and manifest.source["checkpoint"] == "/ckpt"
    assert set(manifest.files) == {"dense.safetensors", "embeddings_0.safetensors"}
    assert all(len(f["sha256"]) == 64 for f in manifest.files.values())
    accuracy = manifest.accuracy
    assert accuracy["passed"] and accuracy["sample"]["examples"] == 512
    assert set(accuracy["by_dtype"]) == {"fp16", "int8", "int4", "int2"}
    # Coarser types lose more: the format's error grows as bits shrink.
    diffs = [accuracy["by_dtype"][d]["mean_abs_logit_diff"] for d in ("fp16", "int8", "int4", "int2")]
    assert diffs == sorted(diffs)
    assert not any(p.suffix in (".pt", ".pkl", ".py") for p in package.iterdir())


def test_metadata(package):
    metadata = Predictor.load(package).metadata
    assert metadata.model_name == "model" and metadata.version == "1"
    assert metadata.feature_names == ["f0", "f1", "g1", "f2", "f3"]
    assert metadata.num_embeddings == {"f0": 80, "f1": 200, "g1": 200, "f2": 120, "f3": 80}
    assert metadata.dense_in_features == 5 and metadata.weighted_features == []
    assert metadata.table_dtypes == {t.name: "int8" for t in CFG.tables}


def test_two_serving_devices_predict_like_one(tmp_path, package):
    split = _export(
        tmp_path / "split", devices=["cpu:0", "cpu:1"], capacity_bytes={"cpu:0": 3000, "cpu:1": 5500}
    )
    manifest = read_manifest(split)
    assert {s.device for s in manifest.placement.shards} == {"cpu:0", "cpu:1"}
    assert any(manifest.placement.is_split(t.name) for t in CFG.tables)
    dense, kjt = request(CFG, batch=40, seed=5)
    single = Predictor.load(package).predict(dense, kjt)
    torch.testing.assert_close(Predictor.load(split).predict(dense, kjt), single, rtol=1e-6, atol=1e-6)


def test_mixed_table_and_dense_dtypes(tmp_path):
    path = _export(
        tmp_path / "mixed", dtype="int4", table_dtypes={"t0": "fp16", "t3": "int2"}, dense_dtype="bf16"
    )
    manifest = read_manifest(path)
    assert {t.name: t.dtype.value for t in manifest.tables} == {
        "t0": "fp16",
        "t1": "int4",
        "t2": "int4",
        "t3": "int2",
    }
    predictor = Predictor.load(path)
    assert predictor.dtype == torch.bfloat16
    dense, kjt = request(CFG, batch=16)
    scores = predictor.predict(dense, kjt)
    assert scores.dtype == torch.float32 and scores.shape == (16,)
    assert (scores - torch.sigmoid(fp32_logits(CFG, STATE, dense, kjt))).abs().max() < 0.1


def test_accuracy_gate_refuses_unless_forced(tmp_path):
    with pytest.raises(AccuracyError, match=r"loses .* AUC .* export refused.*--force"):
        _export(tmp_path / "refused", dtype="int2", max_auc_drop=-1.0)
    assert not (tmp_path / "refused").exists()
    path = _export(tmp_path / "forced", dtype="int2", max_auc_drop=-1.0, force=True)
    accuracy = read_manifest(path).accuracy
    assert accuracy["forced"] and not accuracy["passed"]


def test_a_model_that_scores_everything_one_way_still_gets_an_accuracy_report(tmp_path):
    # An untrained model whose logits are all far below 0 would draw labels of one class and no AUC.
    state = dict(STATE)
    bias = "model.over_arch.model.1.bias"
    state[bias] = torch.full_like(state[bias], -60.0)
    path = export_package(
        tmp_path / "skewed", model_config=CFG, state_dict=state, dtype="int8", accuracy_sample=SAMPLE
    )
    accuracy = read_manifest(path).accuracy
    assert accuracy["passed"]
    assert "median" in accuracy["sample"]["labels"]
    assert accuracy["fp32_auc"] == 1.0


def test_bad_export_requests_are_named(tmp_path, package):
    with pytest.raises(ExportError, match=r"unknown tables \['nope'\]"):
        _export(tmp_path / "a", table_dtypes={"nope": "int4"})
    with pytest.raises(ExportError, match="dense_dtype"):
        _export(tmp_path / "b", dense_dtype="int8")
    missing = {k: v for k, v in STATE.items() if "t2" not in k}
    with pytest.raises(
        ExportError, match=r"no 'model.sparse_arch.embedding_bag_collection.embedding_bags.t2"
    ):
        export_package(tmp_path / "c", model_config=CFG, state_dict=missing)
    with pytest.raises(ExportError, match="exists and is not empty"):
        _export(package)


@pytest.fixture
def copy(tmp_path, package):
    target = tmp_path / "copy"
    shutil.copytree(package, target)
    return target


def test_corrupt_file_is_named(copy):
    path = copy / "embeddings_0.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"embeddings_0\.safetensors: sha256 .* does not match"):
        Predictor.load(copy)


def test_missing_files_are_named(copy):
    (copy / "dense.safetensors").unlink()
    with pytest.raises(PackageError, match=r"dense\.safetensors: missing"):
        Predictor.load(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(PackageError, match=r"manifest\.json: missing"):
        Predictor.load(copy)
    with pytest.raises(PackageError, match="does not exist"):
        Predictor.load(copy / "nowhere")


def test_bad_manifest_is_named(copy):
    manifest = copy / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "format_version": 99}))
    with pytest.raises(PackageError, match=r"manifest\.json: format_version 99 is not supported"):
        Predictor.load(copy)
    manifest.write_text(json.dumps({k: v for k, v in data.items() if k != "placement"}))
    with pytest.raises(PackageError, match=r"manifest\.json: missing key 'placement'"):
        Predictor.load(copy)
    manifest.write_text("{not json")
    with pytest.raises(PackageError, match=r"manifest\.json: not valid JSON"):
        Predictor.load(copy)


def test_unverified_load_still_names_unreadable_files(copy):
    (copy / "embeddings_0.safetensors").write_bytes(b"garbage")
    with pytest.raises(PackageError, match=r"embeddings_0\.safetensors: cannot be read as safetensors"):
        Predictor.load(copy, verify=False)
