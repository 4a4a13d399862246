"""The training job: logs, evaluation, pipelined == plain, exact resume, SIGTERM, files, two ranks."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rectrain.datasets import DataPosition
from rectrain.distributed import ShardingEnv
from rectrain.embedding.backward_choice import auto_choice
from rectrain.errors import RecTrainError
from rectrain.train.config import RunConfig
from rectrain.train.data import RunData
from rectrain.train.job import TrainJob
from tests.distributed.multiprocess import run_multiprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

SMALL_CRITEO_MODEL = [
    "model.dense_arch_layer_sizes=[16, 8]",
    "model.over_arch_layer_sizes=[16, 1]",
    "model.tables=["
    + ", ".join(
        f'{{ name = "t{i}", num_embeddings = 50, embedding_dim = 8, feature_names = ["cat_{i}"] }}'
        for i in range(26)
    )
    + "]",
]


def synthetic(tmp_path: Path, *overrides: str) -> RunConfig:
    """The shipped synthetic example, shrunk for a test, logging and checkpointing under ``tmp_path``."""
    base = [
        "train.batch_size=64",
        "train.steps=20",
        "train.eval_every=10",
        "train.eval_batches=4",
        "train.log_every=5",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        "checkpoint.every_n_steps=10",
    ]
    return RunConfig.load(EXAMPLES / "dlrm_synthetic.toml", [*base, *overrides])


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_criteo(path: Path, rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        dense = [str(rng.randint(0, 50)) for _ in range(13)]
        cats = [format(rng.randrange(16**6), "x") for _ in range(26)]
        lines.append("\t".join([str(rng.randint(0, 1)), *dense, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_ratings(path: Path, rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = [
        f"{rng.randint(1, 60)}::{rng.randint(1, 80)}::{rng.randint(1, 5)}::97830{i}" for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_run_logs_training_and_evaluation_events_and_checkpoints(tmp_path):
    summary = TrainJob(synthetic(tmp_path), progress_bar=False).run()
    assert (summary.start.step, summary.end.step, summary.end.examples) == (0, 20, 20 * 64)
    log = events(tmp_path / "metrics.jsonl")
    train = [e for e in log if e["event"] == "train"]
    assert [e["step"] for e in train] == [5, 10, 15, 20]
    assert all(e["loss"] > 0 and e["examples_per_s"] > 0 for e in train)
    assert [e["examples"] for e in train] == [320, 640, 960, 1280]
    evals = [e for e in log if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [10, 20]
    assert {"auc", "ne", "log_loss", "accuracy", "calibration"} <= set(evals[-1])
    assert evals[-1]["num_examples"] == 4 * 64
    assert [e["step"] for e in log if e["event"] == "checkpoint"] == [10, 20]
    assert summary.checkpoint == tmp_path / "ckpt" / "step_20"
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_20"
    # The run records the embedding backward it trained with, in its log and in every checkpoint.
    (record,) = [e for e in log if e["event"] == "cpu_backward"]
    assert record["kernel"] == auto_choice().kernel and record["reason"] == auto_choice().reason
    manifest = json.loads((summary.checkpoint / "manifest.json").read_text())
    assert manifest["extra"]["cpu_backward"] == {"kernel": record["kernel"], "reason": record["reason"]}


def test_pipelined_and_plain_loops_train_identically(tmp_path):
    results = []
    for pipeline in ("true", "false"):
        config = synthetic(tmp_path / pipeline, f"train.pipeline={pipeline}", 'checkpoint.dir=""')
        results.append(TrainJob(config, progress_bar=False).run().eval_metrics)
    assert results[0] == results[1]


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    straight = TrainJob(synthetic(tmp_path / "a"), progress_bar=False).run()
    TrainJob(synthetic(tmp_path / "b", "train.steps=10"), progress_bar=False).run()
    resumed = TrainJob(synthetic(tmp_path / "b"), progress_bar=False).run()
    assert (resumed.start.step, resumed.start.examples, resumed.end.step) == (10, 640, 20)
    assert resumed.eval_metrics == straight.eval_metrics
    first_resumed_event = [e for e in events(tmp_path / "b" / "metrics.jsonl") if e["event"] == "train"][2]
    assert (first_resumed_event["step"], first_resumed_event["examples"]) == (15, 960)


@pytest.mark.gpu
def test_a_single_process_run_trains_on_cuda_and_resumes_there(tmp_path):
    """``rectrain train`` without torchrun on a GPU: the tables are built on it (an FBGEMM kernel cannot move
    after construction; moving the CPU-built module failed here before), and a resumed run ends where an
    uninterrupted one does."""
    straight = TrainJob(synthetic(tmp_path / "a", 'train.device="cuda"'), progress_bar=False).run()
    assert straight.end.step == 20 and straight.eval_metrics["auc"] > 0
    TrainJob(synthetic(tmp_path / "b", 'train.device="cuda"', "train.steps=10"), progress_bar=False).run()
    resumed = TrainJob(synthetic(tmp_path / "b", 'train.device="cuda"'), progress_bar=False).run()
    assert resumed.start.step == 10
    assert resumed.eval_metrics["auc"] == pytest.approx(straight.eval_metrics["auc"], abs=2e-3)


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_next_step_and_exits_143(tmp_path):
    log = tmp_path / "metrics.jsonl"
    command = [sys.executable, "-m", "rectrain", "train", "--config", str(EXAMPLES / "dlrm_synthetic.toml")]
    command += ["--no-progress", "--set", "train.steps=1000000", "--set", "train.batch_size=64"]
    command += ["--set", f'train.metrics_log="{log}"', "--set", f'checkpoint.dir="{tmp_path / "ckpt"}"']
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and '"train"' in log.read_text()):
            if process.poll() is not None or time.monotonic() >= deadline:
                process.kill()  # before reading its stderr: a live run would hold the read until it ended
                code = process.wait()
                pytest.fail(f"no training event in 120 s, exit code {code}:\n{process.stderr.read()[-2000:]}")
            time.sleep(0.2)
        os.kill(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, err[-2000:]  # not finished: a Job or torchrun restarts and resumes
    assert "stopped by SIGTERM after checkpointing" in out
    step = [e for e in events(log) if e["event"] == "checkpoint"][-1]["step"]
    assert 10 <= step < 1_000_000
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"step_{step}"


def test_criteo_example_reads_its_files_and_holds_out_every_tenth_batch(tmp_path):
    data = write_criteo(tmp_path / "day.tsv", rows=64 * 20)
    config = RunConfig.load(
        EXAMPLES / "dlrm_criteo.toml", [f'data.paths=["{data}"]', "train.batch_size=64", "data.num_workers=0"]
    )
    run_data = RunData(config, rank=0, world_size=1)
    train = list(run_data.train_batches())
    held_out = list(run_data.eval_batches())
    assert (len(train), len(held_out)) == (18, 2)
    batch = train[0].batch
    assert tuple(batch.dense_features.shape) == (64, 13)
    assert batch.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    # Rows 576..639 and 1216..1279 (blocks 9 and 19 of 64 rows) are held out; positions count every row.
    ends = [item.position.offset for item in train]
    assert ends == [64 * (k + 1) for k in range(9)] + [64 * (k + 2) for k in range(9, 18)]
    assert train[-1].position == DataPosition(0, 1216, "rows", "criteo")
    resumed = list(run_data.train_batches(train[14].position))
    assert [item.position for item in resumed] == [item.position for item in train[15:]]


def _train_criteo_rank(env: ShardingEnv, overrides: list[str]) -> tuple[int, dict, int]:
    config = RunConfig.load(EXAMPLES / "dlrm_criteo.toml", overrides)
    summary = TrainJob(config, env, progress_bar=False).run()
    return summary.end.step, summary.eval_metrics, summary.end.examples


@pytest.mark.slow
def test_two_ranks_with_uneven_file_shares_stop_together(tmp_path):
    # Windows of 2 x 64 rows: the one row left after the third window (fewer than the ranks) joins it, so
    # the ranks train 3 steps of 64 + 64, 64 + 64 and 64 + 65 rows: every row once.
    train_file = write_criteo(tmp_path / "train.tsv", rows=2 * 64 * 3 + 1)
    eval_file = write_criteo(tmp_path / "eval.tsv", rows=64 * 3, seed=1)
    overrides = [
        *SMALL_CRITEO_MODEL,
        f'data.paths=["{train_file}"]',
        f'data.eval_paths=["{eval_file}"]',
        "data.num_workers=0",
        "train.batch_size=64",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        'checkpoint.dir=""',
    ]
    (steps0, metrics0, examples), (steps1, metrics1, _) = run_multiprocess(_train_criteo_rank, 2, overrides)
    assert steps0 == steps1 == 3 and examples == 2 * 64 * 3 + 1
    assert metrics0 == metrics1 and metrics0["num_examples"] == 64 * 3


def test_two_tower_movielens_example_trains_and_reports_recall(tmp_path):
    ratings = write_ratings(tmp_path / "ratings.dat", rows=400)
    overrides = [
        f'data.paths=["{ratings}"]',
        "train.batch_size=32",
        "train.epochs=1",
        "train.eval_every=5",
        "train.eval_batches=2",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        'checkpoint.dir=""',
        "model.tables=["
        '{ name = "user", num_embeddings = 64, embedding_dim = 16, feature_names = ["user_id"] }, '
        '{ name = "movie", num_embeddings = 96, embedding_dim = 16, feature_names = ["movie_id"] }]',
    ]
    config = RunConfig.load(EXAMPLES / "two_tower_movielens.toml", overrides)
    summary = TrainJob(config, progress_bar=False).run()
    assert summary.end.step == 12  # 400 rows = 13 batches of 32, every 10th held out
    assert 0.0 <= summary.eval_metrics["recall@10"] <= 1.0
    assert summary.eval_metrics["num_examples"] == 32


def test_strict_stops_at_a_malformed_row_read_by_a_dataloader_worker(tmp_path):
    data = write_criteo(tmp_path / "day.tsv", rows=70)
    data.write_text(data.read_text() + "not a criteo row\n")
    config = RunConfig.load(
        EXAMPLES / "dlrm_criteo.toml",
        [f'data.paths=["{data}"]', "train.batch_size=64", "data.num_workers=1", "data.strict=true"],
    )
    with pytest.raises(RecTrainError, match=r"malformed row \(strict\): .*day\.tsv:71: column \*"):
        list(RunData(config, rank=0, world_size=1).train_batches())
