"""What the main job runs: sizes and knobs (``MainJobConfig``), and the run config it writes for training.

The run config is a normal ``rectrain train`` TOML (the model of ``examples/dlrm_synthetic.toml`` with the
Criteo reader pointed at the job's own files), so a user can re-run or edit ``OUT/run.toml`` by hand. In the
online mode it follows ``OUT/stream`` (``data.follow``) and publishes to ``OUT/publish`` (``[publish]``).
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
    "files",
    "rows_per_file",
    "base_every",
    "probe_rows",
)

# The online mode's sizes where the flags leave them out: bigger tables (the rows of ~2k tokens, hashed),
# smaller batches so every file is several steps, and a light load that leaves CPU to the trainer.
ONLINE_DEFAULTS: dict[str, object] = {
    "vocab_size": 2_000,
    "num_embeddings": 20_000,
    "batch_size": 256,
    "loadgen_concurrency": 2,
    "loadgen_batch": 32,
}
# The planted change: these (column, token rank) pairs click far more from file ``change_at_file`` on;
# ranks 2..4 are frequent enough (a few % of rows each) to be trained on within a file or two.
PLANTED = ((0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4))
CONTROL_RANKS = (5, 6, 7)  # the probe's control tokens: as frequent, never planted


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
    # The online mode (./run.sh --online): files arrive in OUT/stream, 2-rank training follows them and
    # publishes a delta every publish_every_s, a server follows the publish dir under load, and a probe
    # scores planted-id and control examples; from file change_at_file on the planted ids click more.
    online: bool = False
    files: int = 24  # arriving files
    rows_per_file: int = 3_000
    change_at_file: int = 12  # first file with the planted change (0-based)
    file_interval_s: float = 3.0  # seconds between arrivals
    publish_every_s: float = 1.0
    base_every: int = 40  # deltas between bases
    planted_boost: float = 4.0  # logit added to rows holding a planted token
    probe_rows: int = 64  # examples in each of the probe's two batches
    probe_interval_s: float = 0.5
    min_rise: float = 0.05  # the planted-minus-control score must grow by this much, or the job fails

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
        if self.online:
            self._check_online()
        if self.heldout_rows < self.query_rows:
            raise MainJobError(
                f"main job: query_rows ({self.query_rows}) exceeds heldout_rows ({self.heldout_rows})"
            )

    def _check_online(self) -> None:
        if not 1 <= self.change_at_file < self.files:
            raise MainJobError(
                f"main job: change_at_file must be in 1..files-1 (there must be files before and after "
                f"the change), got {self.change_at_file} with files = {self.files}"
            )
        if self.rows_per_file < self.nproc:
            raise MainJobError(
                f"main job: rows_per_file ({self.rows_per_file}) must be >= nproc ({self.nproc})"
            )
        for name in ("file_interval_s", "publish_every_s", "probe_interval_s"):
            if getattr(self, name) <= 0:
                raise MainJobError(f"main job: {name} must be > 0, got {getattr(self, name)}")
        if self.vocab_size <= max(CONTROL_RANKS):
            raise MainJobError(
                f"main job: --online needs vocab_size > {max(CONTROL_RANKS)}, got {self.vocab_size}"
            )


# Knobs of one mode only; giving one to the other mode is an error (it would silently do nothing).
OFFLINE_ONLY = ("rows", "heldout_rows", "steps", "eval_batches", "query_rows", "loadgen_seconds")
ONLINE_ONLY = (
    "files",
    "rows_per_file",
    "change_at_file",
    "file_interval_s",
    "publish_every_s",
    "base_every",
    "planted_boost",
    "probe_rows",
    "probe_interval_s",
    "min_rise",
)


def main_job_config(online: bool = False, **given: object) -> MainJobConfig:
    """A run's config: ``given`` (the flags set) over the mode's defaults (``ONLINE_DEFAULTS`` online)."""
    wrong = [name for name in (OFFLINE_ONLY if online else ONLINE_ONLY) if name in given]
    if wrong:
        flags = ", ".join("--" + name.replace("_", "-") for name in wrong)
        raise MainJobError(
            f"main job: {flags}: {'not' if online else 'only'} with --online"
            + (" (the stream's size is --files x --rows-per-file)" if online else "")
        )
    defaults = ONLINE_DEFAULTS if online else {}
    return MainJobConfig(online=online, **{**defaults, **given})


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

    @property
    def stream(self) -> Path:
        """The directory online training follows (files renamed in as they arrive)."""
        return self.out / "stream"

    @property
    def publish(self) -> Path:
        """Bases ``<N>`` and deltas ``<N>-deltas/<SEQ>`` the online trainer writes and the server follows."""
        return self.out / "publish"

    def probe_file(self, kind: str) -> Path:
        """The probe's examples (``planted`` or ``control``) as Criteo TSV, read by the trainer's reader."""
        return self.data / f"probe-{kind}.tsv"

    @property
    def probe_log(self) -> Path:
        """One JSON line per probe: time, model version, mean planted and control scores."""
        return self.out / "probe.jsonl"


def _toml(value: object) -> str:
    """A TOML literal for a str/int/float/bool/list (JSON strings are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def steps_per_file(cfg: MainJobConfig) -> int:
    """Training steps one arriving file makes: windows of ``nproc x batch_size`` rows, a remainder of fewer
    rows than ranks joining the last one (``rectrain.datasets.windows``)."""
    size = cfg.nproc * cfg.batch_size
    full, rest = divmod(cfg.rows_per_file, size)
    return max(1, full + (rest >= cfg.nproc))


def run_config_text(cfg: MainJobConfig, paths: JobPaths) -> str:
    """The ``rectrain train`` TOML: DLRM over 26 tables, Criteo files, planner, pipelined 2-rank training;
    online, it follows ``paths.stream`` and publishes to ``paths.publish``."""
    tables = "\n".join(
        f'  {{ name = "t_cat_{i}", num_embeddings = {cfg.num_embeddings}, '
        f'embedding_dim = {cfg.embedding_dim}, feature_names = ["cat_{i}"] }},'
        for i in range(NUM_TABLES)
    )
    sections = _online_sections(cfg, paths) if cfg.online else _offline_sections(cfg, paths)
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


_OPTIMIZER = {"sparse": "rowwise_adagrad", "sparse_lr": 0.1, "dense": "adagrad", "dense_lr": 0.05}


def _offline_sections(cfg: MainJobConfig, paths: JobPaths) -> dict[str, dict]:
    return {
        "data": {
            "source": "criteo",
            "paths": [str(paths.train_file.resolve())],
            "eval_paths": [str(paths.heldout_file.resolve())],
            "num_workers": 1,
        },
        "optimizer": _OPTIMIZER,
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
            **_device(cfg),
        },
        "checkpoint": {
            "dir": str(paths.checkpoints.resolve()),
            "every_n_steps": cfg.steps,
            "keep_last": 1,
            "resume": False,
        },
    }


def _online_sections(cfg: MainJobConfig, paths: JobPaths) -> dict[str, dict]:
    # The run ends at train.steps, the step that trains the last file's last window (the stream's length is
    # known here); follow_idle_stop_s only ends a run whose files stopped coming (a failed writer).
    steps = cfg.files * steps_per_file(cfg)
    return {
        "data": {
            "source": "criteo",
            "paths": [str(paths.stream.resolve())],
            "follow": True,
            "follow_poll_s": 0.25,
            "follow_idle_stop_s": cfg.server_start_timeout_s + 60 * cfg.file_interval_s,
            "num_workers": 0,
        },
        "optimizer": _OPTIMIZER,
        "planner": {"max_search_evaluations": 64},
        "train": {
            "batch_size": cfg.batch_size,
            "steps": steps,
            "log_every": max(1, steps_per_file(cfg)),
            "seed": cfg.seed,
            "metrics_log": str(paths.metrics_log.resolve()),
            **_device(cfg),
        },
        "checkpoint": {"dir": str(paths.checkpoints.resolve()), "keep_last": 1, "resume": False},
        "publish": {
            "dir": str(paths.publish.resolve()),
            "every_seconds": cfg.publish_every_s,
            "base_every": cfg.base_every,
            "model_name": "dlrm",
        },
    }


def _device(cfg: MainJobConfig) -> dict[str, str]:
    return {} if cfg.device == "auto" else {"device": cfg.device}
