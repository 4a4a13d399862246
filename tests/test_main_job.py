"""The main job: end to end (real torchrun ranks, real CLIs, real gRPC server) and its failure reporting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

from recserve.client.loadgen import LoadgenResult
from recserve.mainjob import MainJobConfig, MainJobError
from recserve.mainjob.config import JobPaths, run_config_text
from recserve.mainjob.job import MARKER, prepare_out, serving_device
from recserve.mainjob.stages import ServerProcess, cli, free_port, run_stage
from recserve.mainjob.summary import parse_loadgen
from rectrain.train.config import RunConfig

SMALL = [
    "--rows", "6000", "--heldout-rows", "1200", "--vocab-size", "100", "--steps", "60", "--batch-size", "128",
    "--eval-batches", "4", "--query-rows", "200",
    "--loadgen-seconds", "2", "--loadgen-concurrency", "4", "--loadgen-batch", "32",
]  # fmt: skip


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recserve.mainjob", "--out", str(out), *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for heading in ("== main job summary ==", "AUC", "plan (26 tables)", "examples/s", "p99", "/metrics"):
        assert heading in proc.stdout
    assert "server stopped (SIGTERM, exit 0)" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["server_exit_code"] == 0
    assert summary["out"] == str(out)
    assert summary["train_steps"] == 60
    assert summary["eval_auc"] > 0.5 and 0 < summary["eval_ne"] < 2 and summary["eval_log_loss"] > 0
    assert len(summary["plan"]) == 26
    assert {r for p in summary["plan"] for r in p["ranks"]} <= {0, 1}
    assert summary["served_rows"] == 200 and summary["served_max_abs_diff"] <= 1e-5
    assert (
        summary["throughput_examples_per_s"] > 0
        and 0 < summary["latency_p50_ms"] <= summary["latency_p99_ms"]
    )
    assert summary["loadgen_errors"] == "none"
    assert summary["checkpoint_mb"] > 0 and summary["package_mb"] > 0

    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r["event"] == "eval" and r["auc"] > 0.5 for r in evals)
    step_dir = Path(summary["checkpoint_dir"])
    assert json.loads((step_dir / "manifest.json").read_text())["step"] == 60
    package = json.loads((out / "packages/dlrm/1/manifest.json").read_text())
    assert package["model_name"] == "dlrm" and package["version"] == "1"
    assert "recserve_requests_total" in (out / "metrics.prom").read_text()
    assert (out / "data/train.tsv").read_text().count("\n") == 6000
    assert (out / "data/heldout.tsv").read_text().count("\n") == 1200


@given(
    steps=st.integers(1, 10_000),
    batch_size=st.integers(1, 4096),
    num_embeddings=st.integers(2, 100_000),
    embedding_dim=st.sampled_from([4, 8, 16, 64]),
)
def test_run_config_is_a_valid_train_config(steps, batch_size, num_embeddings, embedding_dim) -> None:
    cfg = MainJobConfig(
        out=Path("/tmp/x"), steps=steps, batch_size=batch_size, num_embeddings=num_embeddings,
        embedding_dim=embedding_dim,
    )  # fmt: skip
    paths = JobPaths(Path("/tmp/x"))
    run = RunConfig.from_dict(tomllib.loads(run_config_text(cfg, paths)), source="run.toml")
    assert run.train.steps == steps and run.train.batch_size == batch_size and run.train.pipeline
    assert run.data.source == "criteo" and run.data.eval_paths == [str(paths.heldout_file.resolve())]
    assert len(run.model.tables) == 26
    assert {(t.num_embeddings, t.embedding_dim) for t in run.model.tables} == {
        (num_embeddings, embedding_dim)
    }


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda"])
def test_the_device_reaches_training_export_and_serving(device) -> None:
    cfg = MainJobConfig(out=Path("/tmp/x"), device=device)
    run = RunConfig.from_dict(
        tomllib.loads(run_config_text(cfg, JobPaths(Path("/tmp/x")))), source="run.toml"
    )
    assert run.train.device == device
    assert serving_device(cfg) == ("cuda:0" if device == "cuda" else "cpu")


def test_config_rejects_bad_sizes() -> None:
    with pytest.raises(MainJobError, match="steps must be >= 1, got 0"):
        MainJobConfig(steps=0)
    with pytest.raises(MainJobError, match=r"query_rows \(500\) exceeds heldout_rows \(100\)"):
        MainJobConfig(heldout_rows=100, query_rows=500)
    with pytest.raises(MainJobError, match="device must be one of auto, cpu, cuda, got 'gpu'"):
        MainJobConfig(device="gpu")


def test_failing_stage_names_stage_command_and_output(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "print('loading...'); print('bad thing happened'); raise SystemExit(3)"]
    with pytest.raises(MainJobError) as info:
        run_stage("export", command, tmp_path)
    message = str(info.value)
    assert "stage 'export' failed: exit code 3" in message
    assert "raise SystemExit(3)" in message and "bad thing happened" in message
    assert (tmp_path / "export.log").exists()


def test_server_that_cannot_start_is_reported_with_its_output(tmp_path: Path) -> None:
    port = free_port()
    serve = [*cli("recserve"), "serve", "--package", str(tmp_path / "missing"), "--port", str(port)]
    server = ServerProcess([*serve, "--metrics-port", "-1"], f"127.0.0.1:{port}", tmp_path / "serve.log", 60)
    with pytest.raises(MainJobError, match=r"stage 'serve' failed: exited with \d+") as info, server:
        pass
    assert "missing" in str(info.value)
    assert server.exit_code not in (None, 0)


def test_parse_loadgen_reads_the_real_summary_line() -> None:
    result = LoadgenResult(
        concurrency=8, seconds=2.0, request_batch=64, latencies_s=np.array([0.01, 0.02, 0.03])
    )
    eps, p50, p99, errors = parse_loadgen("warming up\n" + result.summary() + "\n")
    assert eps == pytest.approx(3 * 64 / 2.0, abs=1)
    assert p50 == pytest.approx(20.0, abs=0.01) and p99 == pytest.approx(29.8, abs=0.01)
    assert errors == "none"
    with pytest.raises(MainJobError, match="stage 'loadgen'"):
        parse_loadgen("nothing useful")


def test_output_dir_of_someone_else_is_not_cleared(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(MainJobError, match="not empty"):
        prepare_out(tmp_path)
    assert (tmp_path / "precious.txt").exists()
    earlier = tmp_path / "earlier"
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / MARKER).touch()
    (earlier / "notes.txt").write_text("mine")
    prepare_out(earlier)
    assert not (earlier / "checkpoints").exists() and (earlier / "notes.txt").exists()
