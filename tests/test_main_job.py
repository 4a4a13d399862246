"""The main job: end to end (real torchrun ranks, real CLIs, real gRPC server) and its failure reporting."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

from recserve.cli import build_parser
from recserve.cli import main as recserve_main
from recserve.client.loadgen import LoadgenResult
from recserve.mainjob import MainJobConfig, MainJobError
from recserve.mainjob.cli import config_from_args
from recserve.mainjob.config import (
    CONTROL_RANKS,
    ONLINE_DEFAULTS,
    PLANTED,
    JobPaths,
    main_job_config,
    run_config_text,
    steps_per_file,
)
from recserve.mainjob.job import MARKER, prepare_out, serving_device
from recserve.mainjob.measure import freshness_s, percentile, planted_rise
from recserve.mainjob.stages import ServerProcess, cli, free_port, run_stage
from recserve.mainjob.stream import StreamWriter, file_name, stream_spec, write_probe_file
from recserve.mainjob.summary import OnlineSummary, metric_total, online_failures, parse_loadgen
from recserve.mainjob.traffic import ProbeRecord
from rectrain.datasets import synthetic_criteo_token
from rectrain.datasets.windows import window_bounds
from rectrain.train.config import RunConfig

SMALL = [
    "--rows", "6000", "--heldout-rows", "1200", "--vocab-size", "100", "--steps", "60", "--batch-size", "128",
    "--eval-batches", "4", "--query-rows", "200",
    "--loadgen-seconds", "2", "--loadgen-concurrency", "4", "--loadgen-batch", "32",
]  # fmt: skip


def run_main_job(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``recserve main ARGV`` (what ``python -m recserve.mainjob`` runs) in this process, its stages in their
    own processes as always; returns its output. A new interpreter for the job itself would only add torch's
    import. The job turns SIGTERM into KeyboardInterrupt; the test worker's own handler is put back."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = recserve_main(["main", *argv])
    finally:
        signal.signal(signal.SIGTERM, previous)
    output = capsys.readouterr()
    assert code == 0, output.out[-3000:] + output.err[-3000:]
    return output.out


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    stdout = run_main_job(["--out", str(out), *SMALL], capsys)
    for heading in ("== main job summary ==", "AUC", "plan (26 tables)", "examples/s", "p99", "/metrics"):
        assert heading in stdout
    assert "server stopped (SIGTERM, exit 0)" in stdout

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
    # One worker (the server in its own process): spawned workers would each import torch only to fail alike.
    serve += ["--workers", "1", "--metrics-port", "-1"]
    # 180 s: an upper bound only; importing torch takes a while on a loaded 2-core box
    server = ServerProcess(serve, f"127.0.0.1:{port}", tmp_path / "serve.log", 180)
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


# --online at a tiny size: 6 files of 1,000 rows 1.5 s apart, the change from file 3, a base every 4 deltas
# (so the server also swaps in a second base under load).
TINY_ONLINE = [
    "--online", "--files", "6", "--change-at-file", "3", "--rows-per-file", "1000",
    "--file-interval-s", "1.5", "--num-embeddings", "2000", "--vocab-size", "200", "--batch-size", "128",
    "--probe-rows", "32", "--base-every", "4", "--loadgen-concurrency", "1",
]  # fmt: skip


@pytest.mark.slow
def test_online_main_job_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    stdout = run_main_job(["--out", str(out), *TINY_ONLINE], capsys)
    for heading in ("== main job summary (online) ==", "freshness", "planted ids", "0 failed"):
        assert heading in stdout
    assert "server stopped (SIGTERM, exit 0)" in stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests_failed"] == 0 and summary["failures"] == {}
    assert summary["requests_ok"] > summary["probes"] > 0
    assert summary["score_rise"] >= 0.05
    assert summary["planted_after"] > summary["planted_before"]
    assert summary["version_before"] != summary["version_after"]
    assert summary["freshness_samples"] >= 1
    assert 0 < summary["freshness_p50_s"] <= summary["freshness_p99_s"] < 30
    assert summary["deltas_published"] >= summary["freshness_samples"]
    assert summary["deltas_applied"] >= 1 and summary["deltas_refused"] == 0
    assert summary["bases"] >= 2  # base_every 4: the server swapped in a new base under load
    assert summary["train_steps"] == 6 * 4  # 1,000 rows in windows of 2 x 128: 4 steps a file
    assert summary["server_exit_code"] == 0
    assert summary["final_version"].startswith(str(summary["bases"]))
    assert sorted(p.name for p in (out / "stream").iterdir()) == [f"part-{i:05d}.tsv" for i in range(6)]
    probes = [json.loads(line) for line in (out / "probe.jsonl").read_text().splitlines()]
    assert len(probes) == summary["probes"] and {"time", "version", "planted", "control"} <= set(probes[0])
    assert "recserve_model_deltas_applied_total" in (out / "metrics.prom").read_text()


def test_online_flags_take_the_online_defaults_and_refuse_the_other_mode() -> None:
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["main", "--online", "--files", "5", "--change-at-file", "2"]))
    assert cfg.online and cfg.files == 5 and cfg.change_at_file == 2
    assert cfg.num_embeddings == ONLINE_DEFAULTS["num_embeddings"] and cfg.batch_size == 256
    cfg = config_from_args(parser.parse_args(["main", "--online", "--num-embeddings", "500"]))
    assert cfg.num_embeddings == 500
    assert config_from_args(parser.parse_args(["main"])) == MainJobConfig()
    with pytest.raises(MainJobError, match="--rows: not with --online"):
        config_from_args(parser.parse_args(["main", "--online", "--rows", "10"]))
    with pytest.raises(MainJobError, match="--files, --min-rise: only with --online"):
        config_from_args(parser.parse_args(["main", "--files", "3", "--min-rise", "0.1"]))
    with pytest.raises(MainJobError, match="change_at_file must be in 1..files-1"):
        main_job_config(True, files=4, change_at_file=4)


@given(rows=st.integers(2, 5000), batch_size=st.integers(1, 600), nproc=st.integers(1, 4))
def test_steps_per_file_counts_the_readers_windows(rows, batch_size, nproc) -> None:
    cfg = main_job_config(True, rows_per_file=max(rows, nproc), batch_size=batch_size, nproc=nproc)
    assert steps_per_file(cfg) == len(list(window_bounds(0, cfg.rows_per_file, batch_size, nproc)))


def test_online_run_config_follows_the_stream_and_publishes(tmp_path: Path) -> None:
    cfg = main_job_config(True, out=tmp_path, files=10, change_at_file=5, rows_per_file=1000, batch_size=128)
    paths = JobPaths(tmp_path)
    run = RunConfig.from_dict(tomllib.loads(run_config_text(cfg, paths)), source="run.toml")
    assert run.data.follow and run.data.paths == [str(paths.stream.resolve())]
    assert run.train.steps == 10 * 4 and run.progressive
    assert run.publish.dir == str(paths.publish.resolve()) and run.publish.every_seconds == 1.0
    assert run.publish.base_every == cfg.base_every and run.publish.model_name == "dlrm"
    assert run.checkpoint.dir == str(paths.checkpoints.resolve())


def test_probe_rows_differ_only_in_the_planted_columns(tmp_path: Path) -> None:
    cfg = main_job_config(True, probe_rows=12, vocab_size=100)
    rows = [line.split("\t") for line in write_probe_file(cfg, tmp_path / "p.tsv").read_text().splitlines()]
    planted, control = rows[:12], rows[12:]
    assert len(control) == 12
    columns = {c for c, _ in PLANTED}
    spec = stream_spec(cfg, 0)
    for column in range(26):
        field = 14 + column
        if column in columns:
            hot = {synthetic_criteo_token(spec, c, r) for c, r in PLANTED if c == column}
            cold = {synthetic_criteo_token(spec, column, r) for r in CONTROL_RANKS}
            assert {row[field] for row in planted} == hot and {row[field] for row in control} == cold
        else:
            assert [row[field] for row in planted] == [row[field] for row in control]
    assert [row[:14] for row in planted] == [row[:14] for row in control]


def test_stream_writer_renames_files_in_order_and_holds_the_change_for_the_probe(tmp_path: Path) -> None:
    cfg = main_job_config(True, files=4, change_at_file=2, rows_per_file=20, file_interval_s=0.05)
    probe_scored = threading.Event()
    with StreamWriter(cfg, tmp_path, probe_scored, gate_timeout_s=30) as writer:
        time.sleep(1.0)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00000.tsv", "part-00001.tsv"]
        assert writer.change_time is None
        probe_scored.set()
        writer.join(30)
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(i) for i in range(4)]
    assert writer.arrivals == sorted(writer.arrivals) and writer.change_time == writer.arrivals[2]
    assert stream_spec(cfg, 1).planted == () and stream_spec(cfg, 2).planted == PLANTED


def test_freshness_counts_deltas_served_after_the_server_first_replied() -> None:
    deltas = {(1, 1): 100.0, (1, 2): 110.0, (1, 3): 120.0, (1, 4): 130.0}
    # 1.1 was published before the first reply; 1.3 was never served itself, 1.4 (later) was.
    first_seen = {"1": 105.0, "1.2": 110.5, "1.4": 131.0}
    samples, before = freshness_s(deltas, first_seen)
    assert before == 1 and samples == pytest.approx([0.5, 1.0, 11.0])
    assert percentile(samples, 50) == pytest.approx(1.0) and percentile(samples, 99) == pytest.approx(11.0)
    assert freshness_s(deltas, {}) == ([], 4)


def test_planted_rise_compares_the_last_probe_before_the_change_with_the_last_one() -> None:
    records = [
        ProbeRecord(1.0, "1.1", 0.50, 0.50),
        ProbeRecord(2.0, "1.2", 0.52, 0.50),  # before: lift 0.02
        ProbeRecord(3.0, "1.3", 0.60, 0.50),
        ProbeRecord(4.0, "1.4", 0.80, 0.48),  # lift 0.32 >= 0.02 + 0.40 / 2: half the rise
        ProbeRecord(5.0, "1.5", 0.90, 0.48),  # after: lift 0.42
    ]
    rise = planted_rise(records, change_time=2.5)
    assert rise.before.version == "1.2" and rise.after.version == "1.5"
    assert rise.rise == pytest.approx(0.40) and rise.reaction_s == pytest.approx(1.5)
    assert planted_rise(records, change_time=0.5) is None


def test_online_failures_name_failed_requests_and_a_missing_rise() -> None:
    values = {f.name: 0 for f in fields(OnlineSummary)} | {"failures": {}, "score_rise": 0.3}
    assert online_failures(OnlineSummary(**values), min_rise=0.05) == []
    values |= {"requests_failed": 2, "failures": {"UNAVAILABLE": 2}, "score_rise": 0.01}
    problems = online_failures(OnlineSummary(**values), min_rise=0.05)
    assert problems[0] == "2 requests failed (UNAVAILABLE 2)"
    assert "rose by +0.0100, less than min_rise 0.05" in problems[1]
    values["score_rise"] = float("nan")
    assert len(online_failures(OnlineSummary(**values), min_rise=0.05)) == 2


def test_metric_total_sums_every_label_set() -> None:
    page = (
        "# TYPE recserve_model_deltas_refused_total counter\n"
        'recserve_model_deltas_refused_total{reason="invalid"} 2.0\n'
        'recserve_model_deltas_refused_total{reason="base"} 1.0\n'
        "recserve_model_deltas_applied_total 7.0\n"
    )
    assert metric_total(page, "recserve_model_deltas_refused_total") == 3
    assert metric_total(page, "recserve_model_deltas_applied_total") == 7
    assert metric_total(page, "recserve_model_step") == 0
