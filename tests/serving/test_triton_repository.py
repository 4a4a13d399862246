"""``recserve export --triton-repository``: the repository's layout and configuration, and its Python-backend
model run as Triton runs it (initialize with Triton's arguments, one request at a time with a leading 1).
bench/serve_vs_triton.py serves the same repository with a real ``tritonserver``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from recserve.cli import main as recserve_main
from recserve.errors import ExportError, InvalidRequestError
from recserve.export.triton_backend import TritonPythonModel
from recserve.export.triton_repository import TritonOptions, config_pbtxt, write_triton_repository
from recserve.runtime import Predictor
from recserve.runtime.package import read_manifest

from .conftest import FEATURES, random_batch


def _inputs(dense, kjt) -> dict[str, np.ndarray]:
    """What Triton hands the backend for one request: every input with a leading dimension of 1."""
    out = {"dense": dense.numpy()[None]}
    for f in FEATURES:
        out[f"{f}.lengths"] = kjt[f].lengths().numpy().astype(np.int32)[None]
        out[f"{f}.values"] = kjt[f].values().numpy().astype(np.int64)[None]
    return out


@pytest.fixture
def model(package, tmp_path):
    model_dir = write_triton_repository(package, tmp_path / "repo", TritonOptions(instances=2))
    config = {"parameters": {"torch_threads": {"string_value": "1"}}}
    m = TritonPythonModel()
    m.initialize(
        {"model_config": json.dumps(config), "model_repository": str(model_dir), "model_version": "1"}
    )
    return m


def test_the_repository_holds_the_config_the_model_and_the_package(package, tmp_path):
    model_dir = write_triton_repository(package, tmp_path / "repo", TritonOptions(instances=2))
    assert model_dir == tmp_path / "repo" / "tiny"
    config = (model_dir / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "max_batch_size: 8" in config
    assert "count: 2 kind: KIND_CPU" in config and "max_queue_delay_microseconds: 2000" in config
    assert '{ name: "dense" data_type: TYPE_FP32 dims: [ -1, 4 ] allow_ragged_batch: true }' in config
    assert '{ name: "f1.values" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }' in config
    assert config == config_pbtxt(package, TritonOptions(instances=2))
    assert read_manifest(model_dir / "1" / "package").model_name == "tiny"
    assert "TritonPythonModel" in (model_dir / "1" / "model.py").read_text()


def test_a_version_triton_cannot_name_is_refused(package, tmp_path):
    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["version"] = "01"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="version '01'"):
        write_triton_repository(copy, tmp_path / "repo")


def test_the_backend_scores_a_batch_of_requests_as_the_package_does(model, package):
    predictor = Predictor.load(package)
    batches = [random_batch(b, seed=b) for b in (1, 3, 2)]
    items = [model.item(_inputs(*batch).get) for batch in batches]
    scores, _ = model.scorer(items)
    for got, (dense, kjt) in zip(scores, batches):
        torch.testing.assert_close(got, predictor.predict(dense, kjt), rtol=1e-5, atol=1e-6)


def test_the_backend_refuses_a_request_without_its_leading_one(model):
    inputs = _inputs(*random_batch(2, seed=1))
    inputs["dense"] = inputs["dense"][0]
    with pytest.raises(
        InvalidRequestError, match=r"inputs\['dense'\].shape: expected a leading dimension of 1"
    ):
        model.item(inputs.get)


def test_export_cli_writes_a_repository_from_a_package(package, tmp_path, capsys):
    # The CLI's entry point in this process: a new interpreter would only add torch's import.
    code = recserve_main(
        ["export", "--package", str(package), "--triton-repository", str(tmp_path / "repo"),
         "--triton-instances", "2", "--triton-max-requests", "4"]
    )  # fmt: skip
    output = capsys.readouterr()
    assert code == 0, output.err[-3000:]
    assert "wrote Triton model" in output.out
    config = (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()
    assert "max_batch_size: 4" in config and "count: 2" in config


def test_the_backend_names_the_input_at_fault_and_scores_the_others(model, package):
    good, bad = random_batch(2, seed=4), random_batch(3, seed=5)
    inputs = _inputs(*bad)
    inputs["f1.values"] = np.full_like(inputs["f1.values"], 10_000)
    scores, _ = model.scorer([model.item(_inputs(*good).get), model.item(inputs.get)])
    assert isinstance(scores[1], InvalidRequestError)
    assert str(scores[1]).startswith("inputs['f1.values']: feature 'f1' has id 10000 outside")
    torch.testing.assert_close(scores[0], Predictor.load(package).predict(*good), rtol=1e-5, atol=1e-6)
