"""Faults: a rank killed mid-save, damaged or missing files, and models that do not fit the checkpoint all
leave the last good checkpoint usable and raise errors naming the file, the table and the shapes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal

import pytest
import torch

from rectrain.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
)
from rectrain.checkpoint import save as save_module
from rectrain.checkpoint.verify import verify_checkpoint
from tests.checkpoint import common
from tests.distributed.multiprocess import RankFailedError, run_multiprocess


def _killed_during_second_save(env, root: str) -> None:
    model = common.shard(common.build_model(seed=0), env, "tw_rw_cw")
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(2), env.rank)
    save_checkpoint(root, model=model, optimizer=optimizer, step=2, env=env)
    common.train(model, optimizer, range(2, 4), env.rank)
    # The save of step 4, taken apart so that rank 1 dies after the directory is prepared and before writing.
    snapshot = save_module._snapshot(save_module.Path(root), model, optimizer, 4, None, None, env, copy=False)
    save_module._prepare(snapshot, env)
    if env.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    save_module.commit(snapshot, save_module._write(snapshot), env, save_module.Path(root), keep_last=3)


@pytest.mark.slow
def test_rank_killed_mid_save_leaves_previous_checkpoint_loadable(tmp_path):
    with pytest.raises(RankFailedError):
        run_multiprocess(_killed_during_second_save, 2, str(tmp_path), timeout=60)
    assert (tmp_path / "latest").read_text().strip() == "step_2"
    assert (tmp_path / ".tmp_step_4" / "rank_0.safetensors").is_file()  # rank 0 got that far
    assert verify_checkpoint(tmp_path).ok
    model = common.build_model(seed=3)
    assert load_checkpoint(tmp_path, model=model, optimizer=common.make_optimizer(model)).step == 2

    # A missing shard file is named.
    (tmp_path / "step_2" / "rank_1.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"step_2/rank_1\.safetensors: missing"):
        load_checkpoint(tmp_path, model=common.build_model(seed=3))
    assert any("rank_1.safetensors" in p for p in verify_checkpoint(tmp_path).problems)


@pytest.fixture
def checkpoint(tmp_path):
    model = common.build_model(seed=0)
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(2), 0)
    save_checkpoint(tmp_path, model=model, optimizer=optimizer, step=2)
    return tmp_path


def test_truncated_file_is_named(checkpoint):
    path = checkpoint / "step_2" / "rank_0.safetensors"
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(CheckpointError, match=r"rank_0\.safetensors: \d+ bytes, the manifest records"):
        load_checkpoint(checkpoint, model=common.build_model(seed=1))
    problems = verify_checkpoint(checkpoint).problems
    assert len(problems) == 1 and "rank_0.safetensors" in problems[0]


def test_altered_file_is_named(checkpoint):
    path = checkpoint / "step_2" / "dense.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # one byte of tensor data; the size stays the same
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"dense\.safetensors: sha256 .* \(the file was altered\)"):
        load_checkpoint(checkpoint, model=common.build_model(seed=1))
    assert "dense.safetensors" in verify_checkpoint(checkpoint).problems[0]
    assert verify_checkpoint(checkpoint, checksums=False).ok  # only the checksum can see it


def test_shard_missing_from_manifest_is_named(checkpoint):
    manifest_path = checkpoint / "step_2" / "manifest.json"
    data = json.loads(manifest_path.read_text())
    key = f"{common.EBC_PATH}.embedding_bags.t1.weight"
    data["tables"][key]["weight"]["shards"] = []
    manifest_path.write_text(json.dumps(data))
    problem = f"table 't1' ({key}) weight: the shards cover 0 of 512 values; a shard is missing"
    assert verify_checkpoint(checkpoint).problems == [problem]
    with pytest.raises(CheckpointError, match=re.escape(problem)):  # the loader says what verify says
        load_checkpoint(checkpoint, model=common.build_model(seed=1))


def test_table_shape_mismatch_names_table_and_shapes(checkpoint):
    model = common.build_model(seed=1, rows=[41, 64, 30])
    with pytest.raises(
        CheckpointMismatchError, match=r"table 't0' .*checkpoint has shape \[40, 8\], the model \[41, 8\]"
    ):
        load_checkpoint(checkpoint, model=model)


def test_other_embedding_optimizer_is_named(checkpoint):
    model = common.build_model(seed=1, optimizer="adam")
    with pytest.raises(CheckpointMismatchError, match=r"needs state \['exp_avg', 'exp_avg_sq', 'step'\]"):
        load_checkpoint(checkpoint, model=model, optimizer=common.make_optimizer(model))
    load_checkpoint(checkpoint, model=model)  # weights alone still load


def test_keep_last_and_latest(tmp_path):
    model = common.build_model(seed=0)
    for step in range(1, 6):
        save_checkpoint(tmp_path, model=model, step=step, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_4", "step_5"]
    assert read_manifest(tmp_path).step == 5 and read_manifest(tmp_path, step=4).step == 4
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 3 \(have \['step_4', 'step_5'\]\)"):
        read_manifest(tmp_path, step=3)
    (tmp_path / "latest").write_text("step_9\n")
    with pytest.raises(CheckpointError, match=r"latest names 'step_9', which is not a complete checkpoint"):
        load_checkpoint(tmp_path, model=model)
    shutil.rmtree(tmp_path / "step_5")
    with pytest.raises(ValueError, match="keep_last must be an int >= 1"):
        save_checkpoint(tmp_path, model=model, step=6, keep_last=0)
    with pytest.raises(ValueError, match="extra must be JSON-serialisable"):
        save_checkpoint(tmp_path, model=model, step=6, extra={"x": torch.zeros(1)})
