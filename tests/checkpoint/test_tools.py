"""``load_full_state`` for export, offline re-sharding, and the ``rectrain ckpt`` commands."""

from __future__ import annotations

import pytest
import torch

from rectrain.checkpoint import load_checkpoint, load_full_state, read_manifest, save_checkpoint
from rectrain.checkpoint.offline import reshard_checkpoint
from rectrain.checkpoint.verify import verify_checkpoint
from rectrain.cli import main
from tests.checkpoint import common


@pytest.fixture
def trained(tmp_path):
    model = common.build_model(seed=0, optimizer="rowwise_adagrad")
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(2), 0)
    save_checkpoint(tmp_path / "ckpt", model=model, optimizer=optimizer, step=2, extra={"batches": 2})
    return tmp_path / "ckpt", model, optimizer


def test_load_full_state_uses_prediction_module_names(trained):
    root, model, _ = trained
    manifest, state = load_full_state(root)
    expected = model.model.state_dict()  # DLRMTrain wraps the prediction module as .model
    assert manifest.prediction_prefix == "model."
    assert sorted(state) == sorted(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_offline_reshard_to_three_ranks(trained, tmp_path):
    root, model, optimizer = trained
    out = reshard_checkpoint(root, world_size=3, out=tmp_path / "w3")
    manifest = read_manifest(tmp_path / "w3")
    assert out.name == "step_2" and manifest.world_size == 3 and manifest.plan["world_size"] == 3
    assert {s.rank for t in manifest.tables.values() for s in t.weight.shards} <= {0, 1, 2}
    assert verify_checkpoint(tmp_path / "w3").ok
    _, original = load_full_state(root)
    _, resharded = load_full_state(tmp_path / "w3")
    assert all(torch.equal(original[k], resharded[k]) for k in original)
    fresh = common.build_model(seed=5)
    fresh_optimizer = common.make_optimizer(fresh)
    info = load_checkpoint(tmp_path / "w3", model=fresh, optimizer=fresh_optimizer)
    assert info.extra == {"batches": 2}
    assert common.mismatches(common.capture(model, optimizer), common.capture(fresh, fresh_optimizer)) == []


def test_ckpt_info_verify_reshard_commands(trained, tmp_path, capsys):
    root, _, _ = trained
    assert main(["ckpt", "info", str(root)]) == 0
    out = capsys.readouterr().out
    assert "step 2, saved by 1 rank(s)" in out
    assert "t1" in out and "64 x 8" in out and "momentum1 (per_row)" in out and '{"batches": 2}' in out
    assert main(["ckpt", "verify", str(root)]) == 0
    assert "3 tables fully covered, checksums match" in capsys.readouterr().out
    assert main(["ckpt", "reshard", str(root), "--world-size", "2", "--out", str(tmp_path / "w2")]) == 0
    assert "for 2 rank(s)" in capsys.readouterr().out
    assert main(["ckpt", "verify", str(tmp_path / "w2")]) == 0
    (tmp_path / "w2" / "step_2" / "rank_1.safetensors").write_bytes(b"garbage")
    assert main(["ckpt", "verify", str(tmp_path / "w2")]) == 1
    assert "FAIL" in capsys.readouterr().out and main(["ckpt", "info", str(tmp_path / "nowhere")]) == 2
