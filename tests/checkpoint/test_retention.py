"""Which checkpoints a directory keeps: newest saves (not highest steps), leftovers of kills, file modes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rectrain.checkpoint import read_manifest, save_checkpoint
from rectrain.checkpoint.retention import prune, remove_checkpoints, remove_leftovers
from tests.checkpoint import common


def _names(path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_keep_last_keeps_the_newest_saves_not_the_highest_steps(tmp_path):
    model = common.build_model(seed=0)
    for step in (10, 20, 5):  # a run restarted from scratch saves step 5 after step 20
        save_checkpoint(tmp_path, model=model, step=step, keep_last=2)
    assert _names(tmp_path) == ["latest", "step_20", "step_5"]
    assert read_manifest(tmp_path).step == 5


def test_leftovers_of_killed_saves_and_deletes_are_removed(tmp_path):
    model = common.build_model(seed=0)
    save_checkpoint(tmp_path, model=model, step=3)
    for leftover in ("step_7", ".tmp_step_8", ".tmp_deleting_step_1_ab12", ".old_step_3"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "rank_0.safetensors").write_bytes(b"partial")
    assert {p.name for p in remove_leftovers(tmp_path)} == {
        "step_7",
        ".tmp_step_8",
        ".tmp_deleting_step_1_ab12",
        ".old_step_3",
    }
    assert _names(tmp_path) == ["latest", "step_3"]
    assert remove_checkpoints(tmp_path) == ["step_3"] and _names(tmp_path) == []


@pytest.mark.slow
def test_a_kill_during_the_clean_up_never_leaves_a_checkpoint_without_its_manifest(tmp_path):
    # Many files per checkpoint make each delete slow enough to be killed in the middle of it.
    for step in range(1, 6):
        path = tmp_path / f"step_{step}"
        path.mkdir()
        (path / "manifest.json").write_text(f'{{"created_unix": {step}}}')
        for i in range(5000):
            (path / f"f{i}").write_bytes(b"x")
    (tmp_path / "latest").write_text("step_5\n")
    code = "import pathlib, sys; from rectrain.checkpoint import retention as r; "
    code += "r.prune(pathlib.Path(sys.argv[1]), 1)"
    process = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".tmp_deleting_") for p in tmp_path.iterdir()):
        assert process.poll() is None and time.monotonic() < deadline, "prune ended before it could be killed"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    for path in tmp_path.glob("step_*"):
        assert (path / "manifest.json").is_file(), f"{path.name} lost its manifest but kept its name"
    remove_leftovers(tmp_path)
    prune(tmp_path, 1)
    assert _names(tmp_path) == ["latest", "step_5"]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_checkpoint_files_follow_the_umask(tmp_path, umask, mode):
    model = common.build_model(seed=0)
    previous = os.umask(umask)
    try:
        step_dir = save_checkpoint(tmp_path, model=model, step=1)
    finally:
        os.umask(previous)
    files = [tmp_path / "latest", *step_dir.iterdir()]
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: oct(mode) for f in files}
