"""Training on a directory that keeps growing (``data.follow``): every arriving row trained exactly once
across a stop and a resume, on 1 and 2 ranks; a stop while waiting for data; progressive metrics (scores of
the training forward, any source); the Prometheus exporter.

Every Criteo row's first integer feature is a unique example id; a forward pre-hook on the training model
records the ids of every batch trained (as ``test_data_position`` does). Files arrive while the job trains:
a thread renames each into the directory once the metrics log shows the job reached a given step.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from rectrain.checkpoint import read_manifest
from rectrain.distributed import ShardingEnv
from rectrain.errors import ConfigError
from rectrain.metrics.functional import auc, normalized_entropy
from rectrain.test_utils import get_free_port
from rectrain.train.config import RunConfig
from rectrain.train.job import TrainJob
from rectrain.train.preflight import check_run_paths
from rectrain.train.prometheus import MetricsExporter
from tests.distributed.multiprocess import run_multiprocess
from tests.train.test_job import EXAMPLES, SMALL_CRITEO_MODEL, events, synthetic

BATCH = 16


def write_counted(directory: Path, name: str, ids: range) -> Path:
    """Criteo rows whose first integer feature is the example id, written under a dot-name and renamed in
    (gzip when ``name`` ends in ``.gz``)."""
    rng = random.Random(ids.start)
    lines = []
    for i in ids:
        dense = [str(i)] + [str(rng.randint(0, 50)) for _ in range(12)]
        cats = [format(rng.randrange(16**6), "x") for _ in range(26)]
        lines.append("\t".join([str(rng.randint(0, 1)), *dense, *cats]))
    text = ("\n".join(lines) + "\n").encode()
    temporary = directory / f".{name}"
    temporary.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return temporary.rename(directory / name)


def arrive_at_step(log: Path, step: int, directory: Path, name: str, ids: range) -> threading.Thread:
    """A thread that writes ``name`` once the metrics log shows training step ``step``."""

    def wait_and_write() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and any(e["event"] == "train" and e["step"] >= step for e in _events(log)):
                write_counted(directory, name, ids)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=wait_and_write, daemon=True)
    thread.start()
    return thread


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def _overrides(tmp_path: Path, log: str, *extra: str) -> list[str]:
    return [
        *SMALL_CRITEO_MODEL,
        f'data.paths=["{tmp_path / "incoming"}"]',
        "data.follow=true",
        "data.follow_poll_s=0.05",
        "data.num_workers=0",
        "train.eval_every=0",
        f"train.batch_size={BATCH}",
        "train.log_every=1",
        "train.progressive_window=64",
        f'train.metrics_log="{tmp_path / log}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        *extra,
    ]


def _train_and_record(env: ShardingEnv | None, overrides: list[str]) -> list[int]:
    """Train; the example ids this rank trained on, in order."""
    job = TrainJob(RunConfig.load(EXAMPLES / "dlrm_criteo.toml", overrides), env, progress_bar=False)
    seen: list[int] = []

    def record(module, args) -> None:
        seen.extend(round(math.expm1(v)) for v in args[0].dense_features[:, 0].tolist())

    job.training.model.register_forward_pre_hook(record)
    job.run()
    return seen


def _prepare(tmp_path: Path) -> Path:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    write_counted(incoming, "f000.tsv", range(0, 50))
    (incoming / "f001.tsv.tmp").write_text("still being written\n")  # never read: not complete
    (incoming / ".f002.tsv").write_text("hidden\n")
    return incoming


def _run_twice(tmp_path: Path, world_size: int, first_steps: int, arrive_after: int) -> list[int]:
    """Run 1 trains ``first_steps`` steps (f001.tsv.gz arrives during it), run 2 resumes and ends idle
    (f002.tsv arrives during it); the ids trained in both runs, by all ranks."""
    incoming = _prepare(tmp_path)
    runs = []
    for log, arrival, extra in [
        ("run1.jsonl", ("f001.tsv.gz", range(50, 120), arrive_after), f"train.steps={first_steps}"),
        ("run2.jsonl", ("f002.tsv", range(120, 160), first_steps + 1), "data.follow_idle_stop_s=1.5"),
    ]:
        name, ids, step = arrival
        writer = arrive_at_step(tmp_path / log, step, incoming, name, ids)
        overrides = _overrides(tmp_path, log, extra)
        if world_size == 1:
            runs.append(_train_and_record(None, overrides))
        else:
            runs += run_multiprocess(_train_and_record, world_size, overrides, timeout=240)
        writer.join(timeout=1)
        assert not writer.is_alive(), f"{name} never arrived: the run did not reach step {step}"
    return sorted(i for run in runs for i in run)


def test_arriving_files_are_trained_exactly_once_across_a_stop_and_resume(tmp_path):
    # One rank, batches of 16: f000 (50 rows) is 4 steps (16, 16, 16, 2), so step 6 ends 32 rows into f001.
    trained = _run_twice(tmp_path, 1, first_steps=6, arrive_after=3)
    assert trained == list(range(160))
    manifest = read_manifest(tmp_path / "ckpt")
    assert manifest.data_position == {
        "epoch": 0,
        "offset": 40,
        "unit": "rows",
        "source": "criteo",
        "file": "f002.tsv",
    }
    assert manifest.extra["examples"] == 160
    first = read_manifest(tmp_path / "ckpt" / "step_6")
    assert first.data_position["file"] == "f001.tsv.gz" and first.data_position["offset"] == 32

    progressive = [e for e in events(tmp_path / "run2.jsonl") if e["event"] == "progressive"]
    assert progressive and all(e["ne"] >= 0 and e["num_examples"] <= 64 for e in progressive)
    # NE's window (TorchRec's): the latest whole batches that fit in 64 examples; the batches end files
    # (f001: ..., 16, 6; f002: 16, 16, 8), so they fill all but less than a batch of it
    assert 64 - BATCH < progressive[-1]["num_examples"] <= 64


@pytest.mark.slow
def test_two_ranks_train_arriving_files_exactly_once_across_a_stop_and_resume(tmp_path):
    # Two ranks: windows of 32 rows per file; f000 is 2 steps, step 3 ends 32 rows into f001.
    trained = _run_twice(tmp_path, 2, first_steps=3, arrive_after=1)
    assert trained == list(range(160))
    first = read_manifest(tmp_path / "ckpt" / "step_3")
    assert first.data_position["file"] == "f001.tsv.gz" and first.data_position["offset"] == 32


def test_sigterm_while_waiting_for_data_stops_with_a_checkpoint_of_everything_trained(tmp_path):
    _prepare(tmp_path)
    job = TrainJob(
        RunConfig.load(EXAMPLES / "dlrm_criteo.toml", _overrides(tmp_path, "run.jsonl")), progress_bar=False
    )
    done = threading.Event()

    def stop_when_waiting() -> None:  # f000 is 4 steps; after step 3 the job waits for a next file
        log, deadline = tmp_path / "run.jsonl", time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            if log.exists() and any(e["event"] == "train" and e["step"] >= 3 for e in _events(log)):
                time.sleep(0.3)
                if not done.is_set():
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=stop_when_waiting, daemon=True)
    thread.start()
    try:
        summary = job.run()
    finally:
        done.set()
    assert summary.stopped_by_signal and summary.end.step == 4 and summary.end.examples == 50
    manifest = read_manifest(tmp_path / "ckpt")
    assert manifest.step == 4
    position = {"epoch": 0, "offset": 50, "unit": "rows", "source": "criteo", "file": "f000.tsv"}
    assert manifest.data_position == position


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (['data.paths=["a", "b"]'], "data.paths: data.follow reads one directory, got 2 paths"),
        (["train.epochs=2"], "train.epochs: a followed directory is one pass"),
        (["train.eval_every=5"], "train.eval_every: data.follow trains on every row"),
        (["data.follow_poll_s=400.0"], "data.follow_poll_s: 400.0 s is too close"),
    ],
)
def test_follow_config_mistakes_name_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.load(EXAMPLES / "dlrm_criteo.toml", [*_overrides(tmp_path, "m.jsonl"), *extra])


def test_a_missing_followed_directory_is_refused_before_training(tmp_path):
    config = RunConfig.load(EXAMPLES / "dlrm_criteo.toml", _overrides(tmp_path, "m.jsonl"))
    with pytest.raises(ConfigError, match="data.paths: .*incoming does not exist; data.follow reads"):
        check_run_paths(config)
    with pytest.raises(ConfigError, match="data.eval_paths: a followed directory has no held-out split"):
        check_run_paths(config, training=False)  # rectrain eval


def test_the_exporter_serves_the_run_gauges_and_names_a_busy_port():
    exporter = MetricsExporter(get_free_port(), addr="127.0.0.1")
    try:
        exporter.set(step=7, examples=112, progressive_auc=0.75, progressive_ne=0.9)
        url = f"http://127.0.0.1:{exporter.port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        for line in ["rectrain_step 7.0", "rectrain_progressive_auc 0.75", "rectrain_progressive_ne 0.9"]:
            assert line in text.splitlines()
        with pytest.raises(ConfigError, match="train.metrics_port: cannot serve metrics"):
            MetricsExporter(exporter.port, addr="127.0.0.1")
    finally:
        exporter.close()


def test_progressive_metrics_of_any_source_score_the_training_forwards_logits(tmp_path):
    window = ["train.progressive=true", "train.progressive_window=128", "train.log_every=3"]
    config = synthetic(tmp_path, *window, "train.steps=6", "train.eval_every=0")
    job = TrainJob(config, progress_bar=False)
    scored: list[tuple[torch.Tensor, torch.Tensor]] = []
    job.training.model.register_forward_hook(lambda m, a, out: scored.append((out[1][1], out[1][2])))
    job.run()
    logged = [e for e in events(tmp_path / "metrics.jsonl") if e["event"] == "progressive"]
    assert [e["step"] for e in logged] == [3, 6]
    for event in logged:  # the window: the last two batches of 64 before the logged step
        logits, labels = (torch.cat(t) for t in zip(*scored[event["step"] - 2 : event["step"]]))
        assert event["num_examples"] == 128
        assert event["auc"] == pytest.approx(auc(torch.sigmoid(logits), labels), abs=1e-6)
        assert event["ne"] == pytest.approx(normalized_entropy(torch.sigmoid(logits), labels), rel=1e-5)
