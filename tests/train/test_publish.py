"""Delta publishing from training: after a base and its deltas, the served model is exactly the export of
the trainer's checkpoint at the same step, at one and two ranks, for int8 and fp16 packages."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recserve.export.accuracy import synthetic_sample
from recserve.export.exporter import export_checkpoint
from recserve.export.sources import CheckpointSource
from recserve.runtime.delta import list_stream, read_delta
from recserve.runtime.package import read_manifest
from recserve.runtime.predictor import Predictor
from rectrain.checkpoint import read_manifest as read_checkpoint_manifest
from rectrain.distributed import ShardingEnv
from rectrain.train.config import RunConfig
from rectrain.train.job import TrainJob
from rectrain.train.touched import TouchedRows
from tests.distributed.multiprocess import run_multiprocess
from tests.train.test_follow_job import _overrides as follow_overrides
from tests.train.test_follow_job import _train_and_record as train_and_record
from tests.train.test_follow_job import write_counted
from tests.train.test_job import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
TABLES = ", ".join(
    f'{{ name = "t{i}", num_embeddings = {40 + 10 * i}, embedding_dim = 8, feature_names = ["cat_{i}"] }}'
    for i in range(4)
)


def _config(tmp_path: Path, dtype: str, steps: int, *extra: str) -> list[str]:
    return [
        "model.dense_in_features=4",
        "model.dense_arch_layer_sizes=[8, 8]",
        "model.over_arch_layer_sizes=[8, 1]",
        f"model.tables=[{TABLES}]",
        "train.batch_size=16",
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.log_every=100",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        "checkpoint.keep_last=2",
        f'publish.dir="{tmp_path / "publish"}"',
        "publish.every_seconds=0.000001",  # every step
        "publish.base_every=3",
        f'publish.dtype="{dtype}"',
        "publish.max_auc_drop=1.0",
        *extra,
    ]


def _train(env: ShardingEnv | None, overrides: list[str]) -> int:
    config = RunConfig.load(ROOT / "examples" / "dlrm_synthetic.toml", overrides)
    return TrainJob(config, env, progress_bar=False).run().end.step


def _followed(publish_dir: Path) -> tuple[Predictor, int, list[int]]:
    """The newest base with its deltas applied, the step of the last delta, and the bases on disk."""
    base, deltas = list_stream(publish_dir)
    assert base is not None and deltas, sorted(p.name for p in publish_dir.iterdir())
    manifest = read_manifest(base)
    sha = hashlib.sha256((base / "manifest.json").read_bytes()).hexdigest()
    predictor = Predictor.load(base)
    step = -1
    for sequence, path in enumerate(deltas, start=1):
        delta = read_delta(path, manifest, sha, sequence)
        predictor.apply_delta(delta)
        step = delta.step
    bases = sorted(int(p.name) for p in publish_dir.iterdir() if p.name.isdigit())
    return predictor, step, bases


def _exported(tmp_path: Path, config: RunConfig, step: int, dtype: str) -> Predictor:
    with CheckpointSource(tmp_path / "ckpt", step=step) as checkpoint:
        path = export_checkpoint(
            tmp_path / "full", config.model, checkpoint, dtype=dtype, version="1", max_auc_drop=1.0
        )
    return Predictor.load(path)


def _assert_same_scores(followed: Predictor, exported: Predictor, config: RunConfig) -> None:
    sample = synthetic_sample(config.model, num_examples=256, ids_per_feature=(1, 3), seed=7)
    assert torch.equal(followed.predict(sample.dense, sample.kjt), exported.predict(sample.dense, sample.kjt))


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_one_rank_serves_exactly_the_checkpoint_export(tmp_path, dtype):
    overrides = _config(tmp_path, dtype, steps=10)
    steps = _train(None, overrides)
    config = RunConfig.load(ROOT / "examples" / "dlrm_synthetic.toml", overrides)
    followed, step, _ = _followed(tmp_path / "publish")
    assert step == steps == 10
    _assert_same_scores(followed, _exported(tmp_path, config, steps, dtype), config)


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype, sharding",
    [
        ("int8", '["row_wise", "table_wise"]'),
        ("fp16", '["data_parallel", "table_row_wise"]'),
        ("int8", '["column_wise"]'),  # pieces of rows: joined, then quantized on rank 0
    ],
)
def test_two_ranks_serve_exactly_the_checkpoint_export(tmp_path, dtype, sharding):
    overrides = _config(tmp_path, dtype, 8, f"planner.sharding_types={sharding}")
    steps = run_multiprocess(_train, 2, overrides)
    config = RunConfig.load(ROOT / "examples" / "dlrm_synthetic.toml", overrides)
    followed, step, _ = _followed(tmp_path / "publish")
    assert step == steps[0] == steps[1] == 8
    _assert_same_scores(followed, _exported(tmp_path, config, 8, dtype), config)


def test_a_restarted_run_cuts_a_new_base_from_its_checkpoint(tmp_path):
    first = _config(tmp_path, "int8", steps=4)
    _train(None, first)
    _, _, bases_before = _followed(tmp_path / "publish")
    second = _config(tmp_path, "int8", steps=7)
    _train(None, second)  # resumes at step 4 from the checkpoint
    config = RunConfig.load(ROOT / "examples" / "dlrm_synthetic.toml", second)
    followed, step, bases = _followed(tmp_path / "publish")
    assert step == 7 and bases[-1] > bases_before[-1]
    assert bases == [bases[-1] - 1, bases[-1]]  # older bases retired: the newest and the one before it
    _assert_same_scores(followed, _exported(tmp_path, config, 7, "int8"), config)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps  # the resumed run logged


def _one_table_batches():
    """TouchedRows over one 10-row table, and a batch of the given ids of its one feature."""
    from rectrain.embedding import EmbeddingBagConfig
    from rectrain.models.batch import Batch
    from rectrain.sparse import KeyedJaggedTensor

    tables = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])]

    def batch(ids: list[int]) -> Batch:
        kjt = KeyedJaggedTensor.from_lengths_sync(
            ["f"], torch.tensor(ids), torch.ones(len(ids), dtype=torch.int32)
        )
        return Batch(torch.zeros(len(ids), 1), kjt, torch.zeros(len(ids)))

    return TouchedRows(tables), batch


def test_touched_rows_keep_the_batches_still_in_flight():
    touched, batch = _one_table_batches()

    stream = touched.observe(iter([batch([1, 2]), batch([3, 99]), batch([4]), batch([5]), batch([6])]))
    next(stream), next(stream)
    assert touched.take()[0].tolist() == [1, 2, 3]  # 99 is out of range: no row trains on it
    for _ in stream:
        pass
    # the first take's batches were marked again (they may not have trained yet), then the new ones
    assert touched.take()[0].tolist() == [1, 2, 3, 4, 5, 6]
    assert touched.take()[0].tolist() == [4, 5, 6]  # the three fetched last may still be in flight


def test_touched_rows_mark_again_only_the_batches_not_trained_yet():
    touched, batch = _one_table_batches()

    stream = touched.observe(iter([batch([1]), batch([2]), batch([3]), batch([4])]))
    next(stream), next(stream), next(stream)  # fetched three, one trained
    assert touched.take(trained=1)[0].tolist() == [1, 2, 3]
    next(stream)  # fetched the fourth, three trained: only the fourth is in flight
    assert touched.take(trained=3)[0].tolist() == [2, 3, 4]  # batches 2 and 3 were in flight at the first
    assert touched.take(trained=4)[0].tolist() == [4]
    assert touched.take(trained=4)[0].tolist() == []  # trained rows are published once


def test_a_kill_during_publishing_leaves_only_complete_deltas_and_the_restart_continues(tmp_path):
    overrides = _config(tmp_path, "int8", steps=1_000_000)
    command = [
        sys.executable,
        "-m",
        "rectrain",
        "train",
        "--config",
        str(ROOT / "examples" / "dlrm_synthetic.toml"),
    ]
    command += ["--no-progress", *[arg for o in overrides for arg in ("--set", o)]]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    publish = tmp_path / "publish"
    try:
        deadline = time.monotonic() + 120
        # publishing every step, most moments are inside a publish (a delta or a base being staged)
        while len(list(publish.glob("*-deltas/*"))) < 3:
            if process.poll() is not None or time.monotonic() >= deadline:
                process.kill()  # before reading its stderr: a live run would hold the read until it ended
                code = process.wait()
                pytest.fail(
                    f"fewer than 3 deltas in 120 s, exit code {code}:\n{process.stderr.read()[-2000:]}"
                )
            time.sleep(0.01)
        process.kill()
        process.wait(timeout=60)
    finally:
        process.kill()
    _followed(publish)  # every visible delta of the newest base verifies and applies in sequence
    resumed = _config(tmp_path, "int8", steps=_latest_step(tmp_path) + 3)
    steps = _train(None, resumed)
    config = RunConfig.load(ROOT / "examples" / "dlrm_synthetic.toml", resumed)
    followed, step, _ = _followed(publish)
    assert step == steps and not [p for p in publish.rglob(".*")]  # the killed run's staging is gone
    _assert_same_scores(followed, _exported(tmp_path, config, steps, "int8"), config)


def _latest_step(tmp_path: Path) -> int:
    return int((tmp_path / "ckpt" / "latest").read_text().strip().removeprefix("step_"))


@pytest.mark.slow
def test_a_kill_9_of_a_following_trainer_then_a_restart_trains_every_arriving_row_once(tmp_path):
    """``kill -9`` of a trainer that follows a counted stream and publishes every step: only complete deltas
    are visible, and the restart resumes from its last checkpoint so that, along the checkpoints, every row
    is trained exactly once (the rows the killed run trained after it are trained again, once)."""
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    write_counted(incoming, "f000.tsv", range(0, 400))
    publish = tmp_path / "publish"
    options = [
        f'publish.dir="{publish}"',
        "publish.every_seconds=0.000001",  # every step
        "publish.base_every=4",
        "publish.max_auc_drop=1.0",
        "checkpoint.every_n_steps=2",
        "checkpoint.keep_last=2",
    ]
    first = follow_overrides(tmp_path, "run1.jsonl", *options)
    command = [sys.executable, "-m", "rectrain", "train", "--config", str(EXAMPLES / "dlrm_criteo.toml")]
    command += ["--no-progress", *[arg for o in first for arg in ("--set", o)]]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 300  # a loaded machine trains this stream slowly
        while len(list(publish.glob("*-deltas/*"))) < 3:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()  # before reading its stderr to the end, which a live process never ends
                pytest.fail(f"3 deltas were not published: {process.stderr.read()[-2000:]}")
            time.sleep(0.01)
        process.kill()
        process.wait(timeout=60)
    finally:
        process.kill()
    _followed(publish)  # every visible delta verifies and applies in sequence
    resumed_at = read_checkpoint_manifest(tmp_path / "ckpt").extra["examples"]
    second = follow_overrides(tmp_path, "run2.jsonl", *options, "data.follow_idle_stop_s=1.5")
    assert train_and_record(None, second) == list(range(resumed_at, 400))
    assert read_checkpoint_manifest(tmp_path / "ckpt").extra["examples"] == 400
    _, step, _ = _followed(publish)
    assert step == _latest_step(tmp_path)  # the restart's stream reaches its last step
