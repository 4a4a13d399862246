"""A pruned package served: the server's scores equal the in-process predictor's on the same package, a
running server hot-reloads from an unpruned version to a pruned one, and the Triton repository's backend
scores it as the package does."""

from __future__ import annotations

import json
import shutil

import numpy as np
import torch

from recserve.client import AdminClient, PredictorClient
from recserve.export import export_package
from recserve.export.prune import PrunePolicy
from recserve.export.triton_backend import TritonPythonModel
from recserve.export.triton_repository import TritonOptions, write_triton_repository
from recserve.runtime import Predictor
from recserve.runtime.package import read_manifest, verify_files
from rectrain.models import build_model

from .conftest import FEATURES, admin_target, model_config, random_batch, running_server, target


def _pruned(out, version: str):
    cfg = model_config()
    torch.manual_seed(2)
    state = build_model(cfg).state_dict()
    for key, value in state.items():
        if "embedding_bags" in key:
            value.normal_(0, 0.3)
    return export_package(
        out, model_config=cfg, state_dict=state, model_name="tiny", version=version,
        prune=PrunePolicy.parse("norm:0.4", "mean"), force=True,
    )  # fmt: skip


def test_served_scores_of_a_pruned_package_equal_the_predictors_and_it_hot_reloads(packages, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(packages["1"], models / "1")
    pruned = _pruned(models / "2", "2")
    assert read_manifest(pruned).pruning["tables"]["t0"]["kept"] == 40
    local = Predictor.load(pruned)
    with running_server(models / "1") as server:
        client = PredictorClient(target(server))
        assert AdminClient(admin_target(server)).reload(models / "2") == ("tiny", "2", True)
        for seed in range(3):
            dense, kjt = random_batch(16, seed=seed)
            response = client.predict_response(dense, kjt)
            assert response.model_version == "2"
            assert torch.equal(client.predict(dense, kjt), local.predict(dense, kjt))


def test_the_triton_backend_scores_a_pruned_package_as_the_package_does(tmp_path):
    pruned = _pruned(tmp_path / "pkg", "1")
    model_dir = write_triton_repository(pruned, tmp_path / "repo", TritonOptions(instances=1))
    verify_files(model_dir / "1" / "package", read_manifest(model_dir / "1" / "package"))
    backend = TritonPythonModel()
    config = {"parameters": {"torch_threads": {"string_value": "1"}}}
    backend.initialize(
        {"model_config": json.dumps(config), "model_repository": str(model_dir), "model_version": "1"}
    )
    dense, kjt = random_batch(1, seed=5)
    inputs = {"dense": dense.numpy()[None]}
    for f in FEATURES:
        inputs[f"{f}.lengths"] = kjt[f].lengths().numpy().astype(np.int32)[None]
        inputs[f"{f}.values"] = kjt[f].values().numpy().astype(np.int64)[None]
    scores, _ = backend.scorer([backend.item(inputs.get)])
    torch.testing.assert_close(scores[0], Predictor.load(pruned).predict(dense, kjt), rtol=1e-5, atol=1e-6)
