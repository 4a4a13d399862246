"""Checkpoints of disk tables: resume is exact (and the same as in RAM), a process killed mid-step leaves its
last checkpoint loadable with exactly the saved values."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rectrain.checkpoint import load_checkpoint, save_checkpoint
from rectrain.checkpoint.verify import verify_checkpoint
from rectrain.embedding import disk_tables
from tests.checkpoint import common, disk_common


@pytest.fixture
def disk_dir(tmp_path: Path) -> Iterator[Path]:
    before = disk_tables.settings()
    disk_tables.configure(
        disk_tables.DiskTablesSettings(dir=str(tmp_path / "tables"), cache_bytes=disk_common.CACHE)
    )
    yield tmp_path / "tables"
    disk_tables.configure(before)


def _assert_same(a: dict, b: dict) -> None:
    assert a["pieces"].keys() == b["pieces"].keys()
    for key, pieces in a["pieces"].items():
        for (shard, weight, states), (shard_b, weight_b, states_b) in zip(pieces, b["pieces"][key]):
            assert shard == shard_b and torch.equal(weight, weight_b), key
            assert states.keys() == states_b.keys()
            assert all(torch.equal(v, states_b[n]) for n, v in states.items()), key
    assert all(torch.equal(v, b["dense"][k]) for k, v in a["dense"].items())


def test_resume_of_disk_tables_is_exact_and_the_same_as_ram(tmp_path: Path, disk_dir: Path) -> None:
    model = disk_common.build("disk")
    optimizer = disk_common.make_optimizer(model)
    disk_common.train(model, optimizer, range(2))
    save_checkpoint(tmp_path / "ckpt", model=model, optimizer=optimizer, step=2)
    disk_common.train(model, optimizer, range(2, 5))
    straight = common.capture(model, optimizer)

    for storage in ("disk", "ram"):  # a disk checkpoint resumes on disk, or in RAM: the same training
        resumed = disk_common.build(storage, seed=7)
        resumed_optimizer = disk_common.make_optimizer(resumed)
        assert load_checkpoint(tmp_path / "ckpt", model=resumed, optimizer=resumed_optimizer).step == 2
        disk_common.train(resumed, resumed_optimizer, range(2, 5))
        _assert_same(common.capture(resumed, resumed_optimizer), straight)

    ram = disk_common.build("ram")
    ram_optimizer = disk_common.make_optimizer(ram)
    disk_common.train(ram, ram_optimizer, range(5))
    _assert_same(common.capture(ram, ram_optimizer), straight)


@pytest.mark.slow  # a fresh Python process imports torch and FBGEMM: 10-30 s on a loaded machine
def test_kill_mid_step_leaves_the_last_checkpoint_loadable(tmp_path: Path, disk_dir: Path) -> None:
    root, tables_dir = tmp_path / "ckpt", tmp_path / "killed_tables"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoint.disk_kill_job", str(root), str(tables_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        seen = [child.stdout.readline() for _ in range(3)]  # steps 2, 3 and 4 have begun: 4 is running
        assert seen == ["step 2\n", "step 3\n", "step 4\n"], seen
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert any(tables_dir.rglob("*.weights")), "the killed run's working files stay behind"
    assert verify_checkpoint(root).ok

    loaded = disk_common.build("disk", seed=5)
    loaded_optimizer = disk_common.make_optimizer(loaded)
    assert load_checkpoint(root, model=loaded, optimizer=loaded_optimizer).step == 2
    reference = disk_common.build("ram")
    reference_optimizer = disk_common.make_optimizer(reference)
    disk_common.train(reference, reference_optimizer, range(2))
    _assert_same(common.capture(loaded, loaded_optimizer), common.capture(reference, reference_optimizer))


def _sharded_run(env, storage: str, tables_dir: str) -> dict:
    """Two ranks, t0 table-wise, t1 row-wise, t2 column-wise; t0 and t1 on disk (their shards mapped):
    ``storage = "disk"`` in their configs, or (``key_value``) TorchRec's kernel name in the plan."""
    from rectrain.distributed import DistributedModelParallel
    from rectrain.planner.types import EmbeddingComputeKernel

    disk_tables.configure(disk_tables.DiskTablesSettings(dir=tables_dir, cache_bytes=disk_common.CACHE))
    if storage == "key_value":
        plan = common.plan_for("tw_rw_cw", env.world_size)
        for table in ("t0", "t1"):
            plan.plan[common.EBC_PATH][table].compute_kernel = EmbeddingComputeKernel.KEY_VALUE
        model = DistributedModelParallel(disk_common.build("ram"), env=env, device="cpu", plan=plan)
    else:
        model = common.shard(disk_common.build(storage), env, "tw_rw_cw")
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(3), env.rank)
    mapped = len(list(Path(tables_dir).rglob("*.weights")))
    captured = common.capture(model, optimizer)
    return {"pieces": captured["pieces"], "dense": captured["dense"], "mapped": mapped}


@pytest.mark.slow  # two spawned ranks, three times
def test_sharded_disk_tables_train_like_ram(tmp_path: Path) -> None:
    from tests.distributed.multiprocess import run_multiprocess

    ram = run_multiprocess(_sharded_run, 2, "ram", str(tmp_path / "ram"), timeout=400)
    disk = run_multiprocess(_sharded_run, 2, "disk", str(tmp_path / "disk"), timeout=400)
    key_value = run_multiprocess(_sharded_run, 2, "key_value", str(tmp_path / "kv"), timeout=400)
    assert [r["mapped"] for r in ram] == [0, 0] and all(r["mapped"] >= 1 for r in disk)
    assert all(r["mapped"] >= 1 for r in key_value), "a key_value plan puts the tables on disk"
    for a, b, c in zip(ram, disk, key_value):
        _assert_same(a, b)
        _assert_same(a, c)
