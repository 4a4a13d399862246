"""The dense part's dtype is decided at load: bf16 only where the CPU has it natively and the package's
accuracy gate allows it, fp32 when asked; the decision is logged (issue 37)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor
from recserve.runtime import dense_precision as dp
from tests.export.common import dlrm_config, trained_state

GATE = {"dense_bf16": {"max_abs_logit_diff": 1e-4, "auc_diff": -1e-4, "allowed": True}}


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    cfg = dlrm_config()
    return export_package(
        tmp_path_factory.mktemp("pkg") / "p",
        model_config=cfg,
        state_dict=trained_state(cfg),
        accuracy_sample=synthetic_sample(cfg, 256),
    )


def test_bf16_where_native_and_allowed(monkeypatch):
    monkeypatch.setattr(dp, "native_bf16", lambda: True)
    assert dp.choose_dense_dtype("fp32", GATE, "cpu")[0] == "bf16"
    assert dp.choose_dense_dtype("fp32", GATE, "cpu", "fp32") == ("fp32", "fp32 asked for")
    assert dp.choose_dense_dtype("fp32", GATE, "cuda")[0] == "fp32"
    assert dp.choose_dense_dtype("fp16", GATE, "cpu")[0] == "fp16"  # as exported


def test_fp32_without_native_bf16_or_the_gate(monkeypatch):
    monkeypatch.setattr(dp, "native_bf16", lambda: False)
    dtype, why = dp.choose_dense_dtype("fp32", GATE, "cpu")
    assert dtype == "fp32" and "no native bf16" in why
    assert dp.choose_dense_dtype("fp32", GATE, "cpu", "bf16")[0] == "bf16"  # forced, the gate allowing
    monkeypatch.setattr(dp, "native_bf16", lambda: True)
    refused = {"dense_bf16": {**GATE["dense_bf16"], "allowed": False}}
    assert dp.choose_dense_dtype("fp32", refused, "cpu", "bf16")[0] == "fp32"
    dtype, why = dp.choose_dense_dtype("fp32", {}, "cpu")
    assert dtype == "fp32" and "records no bf16 accuracy" in why


def test_the_environment_chooses_and_a_bad_value_names_it(monkeypatch):
    monkeypatch.setattr(dp, "native_bf16", lambda: True)
    monkeypatch.setenv(dp.ENV, "fp32")
    assert dp.choose_dense_dtype("fp32", GATE, "cpu")[0] == "fp32"
    monkeypatch.setenv(dp.ENV, "fp8")
    with pytest.raises(ValueError, match="RECSERVE_DENSE_DTYPE"):
        dp.choose_dense_dtype("fp32", GATE, "cpu")


def test_export_records_the_gate_and_load_follows_it(tiny_package, tmp_path, monkeypatch, caplog):
    manifest = json.loads((tiny_package / "manifest.json").read_text())
    gate = manifest["accuracy"]["dense_bf16"]
    assert gate["allowed"] is True and gate["max_abs_logit_diff"] < 1e-2
    monkeypatch.setattr(dp, "native_bf16", lambda: True)
    with caplog.at_level(logging.INFO, logger="recserve.runtime.predictor"):
        assert Predictor.load(tiny_package).dtype == torch.bfloat16
    assert "dense part in bf16 (native bf16 on this CPU" in caplog.text
    assert Predictor.load(tiny_package, dense_dtype="fp32").dtype == torch.float32
    monkeypatch.setattr(dp, "native_bf16", lambda: False)
    assert Predictor.load(tiny_package).dtype == torch.float32
    old = tmp_path / "old"
    shutil.copytree(tiny_package, old)
    del manifest["accuracy"]["dense_bf16"]  # a package exported before the gate was recorded
    text = json.dumps(manifest)
    (old / "manifest.json").write_text(text)
    monkeypatch.setattr(dp, "native_bf16", lambda: True)
    assert Predictor.load(old, verify=False).dtype == torch.float32
