"""The command line: demo, train, plan, eval and bench, alone and sharded over two torchrun ranks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rectrain.cli import main


def test_demo_trains_and_reports(capsys):
    assert main(["demo", "--steps", "20", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "trained 20 steps / 1,280 examples" in out
    assert "held-out accuracy" in out


@pytest.mark.slow
def test_demo_under_torchrun_shards_the_tables_over_two_ranks():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "-m",
        "rectrain",
        "demo",
        "--steps",
        "10",
        "--batch-size",
        "64",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharded over 2 ranks" in done.stdout
    assert "sharding plan: world_size 2" in done.stdout
    assert "trained 10 steps / 1,280 examples" in done.stdout  # 10 steps x 64 x 2 ranks


# --- rectrain train | plan | eval | bench -------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = str(ROOT / "examples" / "dlrm_synthetic.toml")


def small_run(tmp_path: Path, steps: int = 12) -> list[str]:
    """``--set`` overrides that shrink the synthetic example and keep its files under ``tmp_path``."""
    pairs = [
        "train.batch_size=64",
        f"train.steps={steps}",
        "train.eval_batches=2",
        "train.log_every=4",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        "checkpoint.every_n_steps=0",
    ]
    return [arg for pair in pairs for arg in ("--set", pair)]


@pytest.mark.parametrize("command", ["demo", "train", "plan", "eval", "bench", "data"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert f"usage: rectrain {command}" in capsys.readouterr().out


@pytest.mark.slow
def test_train_runs_alone_then_eval_and_bench_use_its_config(tmp_path, capsys):
    run = ["--config", SYNTHETIC, *small_run(tmp_path)]
    assert main(["train", *run, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "trained 12 steps / 768 examples" in out
    assert "eval at step 12: auc " in out
    assert f"checkpoint: {tmp_path / 'ckpt' / 'step_12'}" in out
    log = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if e["event"] == "train"] == [4, 8, 12]
    final_eval = [e for e in log if e["event"] == "eval"][-1]

    assert main(["eval", *run]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"eval of {tmp_path / 'ckpt'} at step 12: auc ")
    printed = json.loads(lines[-1])
    assert printed["step"] == 12 and printed["auc"] == pytest.approx(final_eval["auc"])

    assert main(["bench", *run, "--steps", "3", "--warmup", "1"]) == 0
    assert re.search(r"^rectrain bench examples/s \d+$", capsys.readouterr().out.splitlines()[-1])


def test_plan_prints_the_plan_for_a_world_size_and_writes_it(tmp_path, capsys):
    out_file = tmp_path / "plan.json"
    assert main(["plan", "--config", SYNTHETIC, "--world-size", "2", "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "sharding plan: world_size 2" in out
    assert json.loads(out_file.read_text())["world_size"] == 2


def test_config_errors_exit_2_with_the_key_named(tmp_path, capsys):
    assert main(["train", "--config", SYNTHETIC, "--set", "train.batch_size=abc"]) == 2
    err = capsys.readouterr().err
    assert "rectrain: error: dlrm_synthetic.toml: train.batch_size: expected a positive int, got 'abc'" in err


@pytest.mark.slow
def test_train_under_torchrun_on_two_ranks_learns_and_checkpoints(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "-m", "rectrain", "train"]
    command += ["--config", SYNTHETIC, *small_run(tmp_path, steps=120), "--set", "train.batch_size=256"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharding plan: world_size 2" in done.stdout
    assert "trained 120 steps / 61,440 examples" in done.stdout  # 120 steps x 256 x 2 ranks
    log = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    final_eval = [e for e in log if e["event"] == "eval"][-1]
    assert final_eval["step"] == 120 and final_eval["auc"] > 0.5
    assert final_eval["num_examples"] == 2 * 2 * 256  # both ranks' held-out batches
    step_dir = tmp_path / "ckpt" / "step_120"
    assert {p.name for p in step_dir.iterdir()} >= {
        "manifest.json",
        "rank_0.safetensors",
        "rank_1.safetensors",
    }


def test_bench_with_data_times_the_reader_against_in_memory_batches(tmp_path, capsys):
    from tests.train.test_job import SMALL_CRITEO_MODEL, write_criteo

    tsv = write_criteo(tmp_path / "day.tsv", rows=200)
    sets = [a for pair in [*SMALL_CRITEO_MODEL, "train.batch_size=16"] for a in ("--set", pair)]
    config = ["--config", str(ROOT / "examples" / "dlrm_criteo.toml"), *sets]
    assert (
        main(
            [
                "data",
                "convert",
                "--num-embeddings",
                "50",
                "--out",
                str(tmp_path / "c"),
                "--no-progress",
                str(tsv),
            ]
        )
        == 0
    )
    capsys.readouterr()
    for data, reader in ((tsv, "criteo"), (tmp_path / "c", "converted")):
        assert (
            main(["bench", *config, "--data", str(data), "--steps", "2", "--warmup", "1", "--rounds", "2"])
            == 0
        )
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(
            "2 rounds x 2 steps (pipelined) of 16 examples x 1 ranks, the streams in turn"
        )
        assert out[1].startswith("  synthetic batches, in memory: ") and "(100.0%)" in out[1]
        assert out[3].startswith(f"  {data} through the {reader} reader: ")
        assert re.fullmatch(r"rectrain bench data/baseline \d+\.\d{3}", out[-2])
        assert re.fullmatch(r"rectrain bench data/baseline-cpu \d+\.\d{3}", out[-1])
    assert main(["bench", *config, "--data", str(tmp_path / "missing.tsv")]) == 2
    assert "missing.tsv does not exist" in capsys.readouterr().err
