"""What the main job runs: sizes and knobs (``MainJobConfig``), and the run config it writes for training.

The run config is a normal ``rectrain train`` TOML (the model of ``examples/dlrm_synthetic.toml`` with the
Criteo reader pointed at the job's own files), so a user can re-run or edit ``OUT/run.toml`` by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from recserve.errors import RecServeError

NUM_TABLES = 26  # one table per Criteo categorical column
DEVICES = ("auto", "cpu", "cuda")


class MainJobError(RecServeError):
    """A stage of the main job failed, or the job was configured wrongly; the message names the stage."""


_POSITIVE = (
    "rows",
    "heldout_rows",
    "vocab_size",
    "embedding_dim",
    "steps",
    "batch_size",
    "eval_batches",
    "nproc",
    "query_rows",
    "loadgen_concurrency",
    "loadgen_batch",
)


@dataclass(frozen=True)
class MainJobConfig:
    """Sizes of one main-job run. The defaults finish in about a minute and a half on 2 CPU cores."""

    out: Path = Path("runs/main")
    rows: int = 200_000  # synthetic training rows
    heldout_rows: int = 20_000  # rows written to a separate held-out file
    vocab_size: int = 1_000  # distinct tokens per categorical column
    num_embeddings: int = 1_000  # rows of each of the 26 tables
    embedding_dim: int = 16
    steps: int = 400
    batch_size: int = 512  # per rank
    eval_batches: int = 8  # per rank
    nproc: int = 2  # local training ranks
    query_rows: int = 256  # held-out rows sent to the server and compared with the in-process Predictor
    loadgen_seconds: float = 10.0
    loadgen_concurrency: int = 8
    loadgen_batch: int = 64
    server_start_timeout_s: float = 90.0
    seed: int = 0
    # Where it all runs: "cuda" trains on the GPUs (one per rank), exports the package placed on cuda:0 and
    # serves it there; "cpu" everywhere; "auto" trains where rectrain's train.device = "auto" picks, and
    # exports and serves on the CPU.
    device: str = "auto"

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            if getattr(self, name) < 1:
                raise MainJobError(f"main job: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_embeddings < 2:
            raise MainJobError(
                f"main job: num_embeddings must be >= 2 (row 0 is 'missing'), got {self.num_embeddings}"
            )
        if self.loadgen_seconds <= 0 or self.server_start_timeout_s <= 0:
            raise MainJobError("main job: loadgen_seconds and server_start_timeout_s must be > 0")
        if self.device not in DEVICES:
            raise MainJobError(f"main job: device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.heldout_rows < self.query_rows:
            raise MainJobError(
                f"main job: query_rows ({self.query_rows}) exceeds heldout_rows ({self.heldout_rows})"
            )


@dataclass(frozen=True)
class JobPaths:
    """Every artefact of a run, under one output directory."""

    out: Path

    @property
    def data(self) -> Path:
        return self.out / "data"

    @property
    def train_file(self) -> Path:
        return self.data / "train.tsv"

    @property
    def heldout_file(self) -> Path:
        return self.data / "heldout.tsv"

    @property
    def run_config(self) -> Path:
        return self.out / "run.toml"

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    @property
    def metrics_log(self) -> Path:
        return self.out / "metrics.jsonl"

    @property
    def package(self) -> Path:
        return self.out / "packages" / "dlrm" / "1"

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @property
    def summary(self) -> Path:
        return self.out / "summary.json"

    @property
    def scrape(self) -> Path:
        return self.out / "metrics.prom"


def _toml(value: object) -> str:
    """A TOML literal for a str/int/float/bool/list (JSON strings are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def run_config_text(cfg: MainJobConfig, paths: JobPaths) -> str:
    """The ``rectrain train`` TOML: DLRM over 26 tables, Criteo files, planner, pipelined 2-rank training."""
    tables = "\n".join(
        f'  {{ name = "t_cat_{i}", num_embeddings = {cfg.num_embeddings}, '
        f'embedding_dim = {cfg.embedding_dim}, feature_names = ["cat_{i}"] }},'
        for i in range(NUM_TABLES)
    )
    sections = {
        "data": {
            "source": "criteo",
            "paths": [str(paths.train_file.resolve())],
            "eval_paths": [str(paths.heldout_file.resolve())],
            "num_workers": 1,
        },
        "optimizer": {"sparse": "rowwise_adagrad", "sparse_lr": 0.1, "dense": "adagrad", "dense_lr": 0.05},
        "planner": {"max_search_evaluations": 64},
        "train": {
            "batch_size": cfg.batch_size,
            "steps": cfg.steps,
            "eval_every": cfg.steps,
            "eval_batches": cfg.eval_batches,
            "log_every": max(1, cfg.steps // 10),
            "seed": cfg.seed,
            "pipeline": True,
            "metrics_log": str(paths.metrics_log.resolve()),
            **({} if cfg.device == "auto" else {"device": cfg.device}),
        },
        "checkpoint": {
            "dir": str(paths.checkpoints.resolve()),
            "every_n_steps": cfg.steps,
            "keep_last": 1,
            "resume": False,
        },
    }
    lines = [
        "# Written by the main job (recserve main / ./run.sh): rerun with",
        f"#   torchrun --nproc-per-node {cfg.nproc} -m rectrain train --config {paths.run_config}",
        "",
        "[model]",
        'kind = "dlrm"',
        "dense_in_features = 13",
        f"dense_arch_layer_sizes = [64, {cfg.embedding_dim}]",
        "over_arch_layer_sizes = [64, 32, 1]",
        f"tables = [\n{tables}\n]",
    ]
    for name, table in sections.items():
        lines += ["", f"[{name}]", *(f"{key} = {_toml(value)}" for key, value in table.items())]
    return "\n".join(lines) + "\n"
