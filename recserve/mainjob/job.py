"""The main job: synthetic Criteo data -> 2-rank training -> checkpoint -> int8 package -> gRPC server ->
queries and a load test -> summary, each stage a real subprocess of the ``rectrain`` / ``recserve`` CLIs.

Stage order (each needs the previous one's artefacts): data, train, verify, export, serve, query, loadgen,
scrape, then the summary is printed and the server is stopped with SIGTERM, which must exit 0.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import torch

from recserve.client import PredictorClient
from recserve.mainjob.config import JobPaths, MainJobConfig, MainJobError, run_config_text
from recserve.mainjob.stages import Echo, ServerProcess, StageTimer, cli, free_port, run_stage
from recserve.mainjob.summary import (
    MainJobSummary,
    dir_mb,
    format_summary,
    last_eval,
    parse_loadgen,
    plan_of,
)
from recserve.runtime import Predictor
from rectrain.datasets import SyntheticCriteoSpec, write_synthetic_criteo
from rectrain.metrics import auc
from rectrain.models.batch import Batch
from rectrain.train.config import RunConfig
from rectrain.train.data import RunData

MARKER = ".rectrain-main-job"  # marks an output dir this job may clean and reuse
OWNED = (
    "data",
    "logs",
    "checkpoints",
    "packages",
    "run.toml",
    "metrics.jsonl",
    "metrics.prom",
    "summary.json",
    "stream",  # the online mode's
    "publish",
    "probe.jsonl",
)


def prepare_out(out: Path) -> JobPaths:
    """Create ``out``, or clear an earlier main-job run's artefacts in it; refuse any other non-empty dir."""
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise MainJobError(f"main job: output dir {out} is not empty and not from an earlier run; pick --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).touch()
    for name in OWNED:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return JobPaths(out)


def write_data(cfg: MainJobConfig, paths: JobPaths) -> None:
    """Training and held-out TSVs drawn from one hidden task, split by line (no row in both), and run.toml."""
    paths.data.mkdir(parents=True, exist_ok=True)
    spec = SyntheticCriteoSpec(num_rows=cfg.rows + cfg.heldout_rows, vocab_size=cfg.vocab_size, seed=cfg.seed)
    everything = write_synthetic_criteo(paths.data / "all.tsv", spec)
    with open(everything) as src, open(paths.train_file, "w") as train, open(paths.heldout_file, "w") as held:
        for i, line in enumerate(src):
            (train if i < cfg.rows else held).write(line)
    everything.unlink()
    paths.run_config.write_text(run_config_text(cfg, paths))


def serving_device(cfg: MainJobConfig) -> str:
    """Where the package is placed and served: GPU 0 for ``--device cuda``, else the CPU."""
    return "cuda:0" if cfg.device == "cuda" else "cpu"


def heldout_batch(paths: JobPaths, rows: int) -> Batch:
    """The first ``rows`` held-out rows, read by the training job's own Criteo reader and hashing."""
    return criteo_batch(paths.run_config, paths.heldout_file, rows, "query")


def criteo_batch(run_config: Path, file: Path, rows: int, stage: str) -> Batch:
    """The first ``rows`` rows of ``file`` as one batch, read by ``run_config``'s Criteo reader and hashing
    (as a held-out file: an online run config's followed directory is set aside)."""
    overrides = [f"train.batch_size={rows}", "train.eval_batches=1", "data.num_workers=0"]
    overrides += ["data.follow=false", f"data.eval_paths=[{json.dumps(str(file))}]"]
    config = RunConfig.load(run_config, overrides)
    batch = next(RunData(config, rank=0, world_size=1).eval_batches(), None)
    if batch is None:
        raise MainJobError(f"stage '{stage}': {file} gave no rows")
    return batch


def query_server(target: str, package: Path, batch: Batch, device: str = "cpu") -> tuple[float, float]:
    """Scores from the server vs the in-process Predictor on ``device`` (the server's) on ``batch``:
    ``(AUC, max abs difference)``."""
    with PredictorClient(target, timeout=30.0) as client:
        served = client.predict(batch.dense_features, batch.sparse_features)
    local = Predictor.load(package, device=device).predict(batch.dense_features, batch.sparse_features)
    diff = float((served - local).abs().max())
    if served.shape != local.shape or diff > 1e-5:
        raise MainJobError(
            f"stage 'query': server scores differ from the in-process Predictor on {package}: "
            f"shapes {tuple(served.shape)} vs {tuple(local.shape)}, max |diff| {diff:.3g} (allowed 1e-5)"
        )
    return auc(served, batch.labels.to(torch.float32)), diff


def scrape(url: str, path: Path) -> str:
    """GET the Prometheus endpoint once and keep the text in ``path``."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError as e:
        raise MainJobError(f"stage 'scrape': GET {url} failed: {e}") from None
    if "recserve_requests_total" not in text:
        raise MainJobError(f"stage 'scrape': {url} has no recserve_requests_total; see {path}")
    path.write_text(text)
    return text


def run_offline_job(cfg: MainJobConfig, echo: Echo = print) -> MainJobSummary:
    """Run every stage in order; return the summary (also ``OUT/summary.json``). Raises ``MainJobError``."""
    if cfg.online:
        raise MainJobError("main job: cfg.online is set; run it with recserve.mainjob.run_main_job")
    paths = prepare_out(cfg.out)
    timer = StageTimer(echo)
    with timer.stage("data", f"{cfg.rows:,} training + {cfg.heldout_rows:,} held-out rows -> {paths.data}"):
        write_data(cfg, paths)
    step_dir = _train_and_export(cfg, paths, timer)
    evaluation = last_eval(paths.metrics_log)
    summary = MainJobSummary(
        out=str(paths.out),
        eval_auc=evaluation["auc"],
        eval_ne=evaluation["ne"],
        eval_log_loss=evaluation["log_loss"],
        train_steps=evaluation["step"],
        plan=plan_of(step_dir),
        checkpoint_dir=str(step_dir),
        checkpoint_mb=dir_mb(step_dir),
        package_dir=str(paths.package),
        package_mb=dir_mb(paths.package),
        served_rows=0,
        served_auc=float("nan"),
        served_max_abs_diff=float("nan"),
        throughput_examples_per_s=0.0,
        latency_p50_ms=0.0,
        latency_p99_ms=0.0,
        loadgen_errors="",
        metrics_url="",
        serving_device=serving_device(cfg),
    )
    _serve_and_measure(cfg, paths, timer, summary, echo)
    summary.stage_seconds = timer.seconds
    paths.summary.write_text(summary.to_json())
    return summary


def train_command(cfg: MainJobConfig, paths: JobPaths) -> list[str]:
    """``torchrun`` of ``rectrain train`` on ``cfg.nproc`` local ranks with the job's run config."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.nproc)]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
    return [*torchrun, "-m", "rectrain", "train", "--no-progress", "--config", str(paths.run_config)]


def _train_and_export(cfg: MainJobConfig, paths: JobPaths, timer: StageTimer) -> Path:
    """Stages train, verify, export; returns the checkpoint's step directory."""
    train = train_command(cfg, paths)
    ranks = f"{cfg.nproc} ranks (torchrun, device {cfg.device})"
    with timer.stage("train", f"DLRM, {cfg.steps} steps x {cfg.batch_size} x {ranks}"):
        output = run_stage("train", train, paths.logs)
    for line in output.splitlines():
        if line.startswith(("trained ", "eval at ", "checkpoint: ")):
            timer.echo("    " + line)
    step_dir = paths.checkpoints / (paths.checkpoints / "latest").read_text().strip()
    with timer.stage("verify", f"rectrain ckpt verify {step_dir}"):
        run_stage("verify", [*cli("rectrain"), "ckpt", "verify", str(step_dir)], paths.logs)
    export = [*cli("recserve"), "export", "--checkpoint", str(paths.checkpoints), "--out", str(paths.package)]
    export += ["--dtype", "int8", "--model-name", "dlrm", "--version", "1", "--devices", serving_device(cfg)]
    with timer.stage("export", f"int8 package on {serving_device(cfg)} -> {paths.package}"):
        run_stage("export", export, paths.logs)
    return step_dir


def _serve_and_measure(
    cfg: MainJobConfig, paths: JobPaths, timer: StageTimer, summary: MainJobSummary, echo: Echo
) -> None:
    """Stages serve, query, loadgen, scrape; prints the summary, then stops the server (exit 0 required)."""
    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    summary.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    serve = [*cli("recserve"), "serve", "--package", str(paths.package), "--port", str(port)]
    serve += ["--metrics-port", str(metrics_port), "--admin-port", "-1"]  # no reloads in this job
    serve += ["--device", serving_device(cfg)]
    server = ServerProcess(serve, target, paths.logs / "serve.log", cfg.server_start_timeout_s)
    with ExitStack() as running:
        with timer.stage("serve", f"recserve serve on {target}, metrics on {summary.metrics_url}"):
            running.enter_context(server)  # stopped with SIGTERM when this block exits, also on Ctrl-C
        with timer.stage("query", f"{cfg.query_rows} held-out rows via PredictorClient"):
            batch = heldout_batch(paths, cfg.query_rows)
            summary.served_auc, summary.served_max_abs_diff = query_server(
                target, paths.package, batch, serving_device(cfg)
            )
            summary.served_rows = int(batch.labels.numel())
        loadgen = [*cli("recserve"), "loadgen", "--target", target, "--duration", str(cfg.loadgen_seconds)]
        loadgen += ["--concurrency", str(cfg.loadgen_concurrency), "--batch", str(cfg.loadgen_batch)]
        with timer.stage("loadgen", f"{cfg.loadgen_concurrency} clients x batch {cfg.loadgen_batch}"):
            output = run_stage("loadgen", loadgen, paths.logs, timeout_s=cfg.loadgen_seconds + 120)
        eps, p50, p99, errors = parse_loadgen(output)
        summary.throughput_examples_per_s, summary.latency_p50_ms, summary.latency_p99_ms = eps, p50, p99
        summary.loadgen_errors = errors
        with timer.stage("scrape", summary.metrics_url):
            scrape(summary.metrics_url, paths.scrape)
        summary.stage_seconds = timer.seconds
        echo("")
        echo(format_summary(summary))
    summary.server_exit_code = server.exit_code
    if server.exit_code != 0:
        raise MainJobError(
            f"stage 'stop': the server exited with {server.exit_code} after SIGTERM (expected 0); "
            f"see {server.log}"
        )
    echo(f"server stopped (SIGTERM, exit 0); artefacts in {paths.out}")
