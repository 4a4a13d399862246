"""The data position is global: a run resumed on another number of ranks trains every line once per epoch.

The Criteo file's first integer column holds the line number, and a forward pre-hook on the training model
records the lines of every batch it trains, so the test sees exactly which lines were trained, in which run.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
from pathlib import Path

import pytest

from rectrain.checkpoint import read_manifest
from rectrain.distributed import ShardingEnv
from rectrain.train.config import RunConfig
from rectrain.train.job import TrainJob
from tests.distributed.multiprocess import run_multiprocess
from tests.train.test_job import EXAMPLES, SMALL_CRITEO_MODEL

ROWS, BATCH = 2 * 32 * 10 + 17, 32  # not a whole number of windows for 1, 2 or 3 ranks


def write_numbered_criteo(path: Path, rows: int) -> Path:
    """Criteo rows whose first integer feature is the line number (0-based)."""
    rng = random.Random(0)
    lines = []
    for i in range(rows):
        dense = [str(i)] + [str(rng.randint(0, 50)) for _ in range(12)]
        cats = [format(rng.randrange(16**6), "x") for _ in range(26)]
        lines.append("\t".join([str(rng.randint(0, 1)), *dense, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def _overrides(tmp_path: Path, ckpt: Path, *extra: str) -> list[str]:
    return [
        *SMALL_CRITEO_MODEL,
        f'data.paths=["{tmp_path / "lines.tsv"}"]',
        f'data.eval_paths=["{tmp_path / "lines.tsv"}"]',
        "data.num_workers=0",
        f"train.batch_size={BATCH}",
        "train.eval_batches=1",
        'train.metrics_log="/dev/null"',
        f'checkpoint.dir="{ckpt}"',
        *extra,
    ]


def _train_and_record(env: ShardingEnv | None, overrides: list[str]) -> list[int]:
    """Train; the line numbers of every example this rank trained on, in order."""
    job = TrainJob(RunConfig.load(EXAMPLES / "dlrm_criteo.toml", overrides), env, progress_bar=False)
    seen: list[int] = []

    def record(module, args) -> None:
        seen.extend(round(math.expm1(v)) for v in args[0].dense_features[:, 0].tolist())

    job.training.model.register_forward_pre_hook(record)
    job.run()
    return seen


@pytest.mark.slow
def test_resuming_on_one_or_three_ranks_trains_every_line_once_per_epoch(tmp_path):
    write_numbered_criteo(tmp_path / "lines.tsv", ROWS)
    ckpt = tmp_path / "ckpt2"
    first = run_multiprocess(_train_and_record, 2, _overrides(tmp_path, ckpt, "train.steps=4"), timeout=240)
    before = sorted(i for lines in first for i in lines)
    assert before == list(range(4 * 2 * BATCH)), "four windows of two ranks: the first 256 lines"

    one, three = tmp_path / "ckpt1", tmp_path / "ckpt3"
    shutil.copytree(ckpt, one)
    shutil.copytree(ckpt, three)
    alone = _train_and_record(None, _overrides(tmp_path, one, "train.epochs=1"))
    assert sorted(before + alone) == list(range(ROWS))
    assert alone == list(range(len(before), ROWS)), "one rank reads the rest in file order"

    after = run_multiprocess(_train_and_record, 3, _overrides(tmp_path, three, "train.epochs=1"), timeout=240)
    assert sorted(before + [i for lines in after for i in lines]) == list(range(ROWS))
    manifest = read_manifest(three)
    assert manifest.data_position == {"epoch": 0, "offset": ROWS, "unit": "rows", "source": "criteo"}
    assert manifest.extra["examples"] == ROWS


@pytest.mark.slow
def test_a_checkpoint_without_a_data_position_resumes_per_rank_as_before_and_warns(tmp_path, caplog):
    write_numbered_criteo(tmp_path / "lines.tsv", ROWS)
    ckpt = tmp_path / "ckpt"
    run_multiprocess(_train_and_record, 2, _overrides(tmp_path, ckpt, "train.steps=2"), timeout=240)
    manifest_path = ckpt / "step_2" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["data_position"]  # as written by rectrain before the position was global
    manifest_path.write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="rectrain"):
        resumed = _train_and_record(None, _overrides(tmp_path, ckpt, "train.steps=3"))
    assert "records no global data position" in caplog.text
    assert "saved by 2 ranks, resumed on 1" in caplog.text
    assert resumed == list(range(2 * BATCH, 3 * BATCH)), "each rank skips `step` batches of its stream"
