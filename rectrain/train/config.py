"""``RunConfig``: everything a training run needs, read from TOML (``rectrain train --config run.toml``).

Sections: ``[model]`` (``ModelConfig``), ``[data]``, ``[optimizer]``, ``[planner]``, ``[train]``,
``[checkpoint]``, ``[publish]``. Every key is checked (unknown keys are errors, with a did-you-mean) and so
is its type; a message names the file, the key path and the expected type. Relative paths are relative to
the working directory. ``--set section.key=value`` overrides are applied before checking, as if written in
the file.

The data's shape follows the model: dense width is ``model.dense_in_features`` and each feature's id range is
the row count of the table that reads it, so sizes are written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rectrain.errors import ConfigError
from rectrain.train.schedule import DECAYS, LRSchedule
from rectrain.train.schema import (
    apply_overrides,
    choices,
    load_toml,
    non_negative,
    positive,
    read_section,
    unknown_key_message,
)

if TYPE_CHECKING:
    from rectrain.models.config import ModelConfig

SPARSE_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam", "adamw")
SHARDING_TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise")


@dataclass
class DataConfig:
    """Where batches come from and which of them are held out for evaluation.

    ``synthetic`` draws learnable labels (``rectrain.datasets.synthetic``); its held-out split comes from
    batch streams no training rank reads. For files (``criteo``, ``movielens``, ``converted``, ``parquet``)
    the held-out split is ``eval_paths`` when given, else every ``holdout_every``-th block of
    ``train.batch_size`` rows of the files (counted from the first row, whatever the number of ranks; never
    trained on). ``num_batches`` is the synthetic epoch length per rank (default: as many as the run needs).
    MovieLens ratings become binary labels: 1 when rating >= ``threshold``.

    ``converted``: directories written by ``rectrain data convert`` (their ids were hashed into the table
    sizes the model must have). ``parquet``: your own files; ``sparse_columns`` are integer (or list of
    integer) id columns named like the model's features, ``dense_columns`` the model's dense inputs in order,
    ``label_column`` the label. ``shuffle`` (converted, parquet): each epoch reads blocks of rows in an order
    drawn from ``train.seed`` and the epoch. ``prefetch``: batches a background thread prepares ahead of
    training when ``num_workers = 0`` (with workers, each worker's prefetch depth); 0 turns it off.
    ``num_workers``: DataLoader processes reading the text sources and synthetic data; converted data and
    Parquet are always read by the prefetch thread (cheaper than sending each batch from a process).

    ``follow``: ``paths`` is one directory whose files (of ``source``'s format; converted data: directories)
    arrive while the run trains (``rectrain.datasets.follow``: complete once renamed in, read once each in
    name order, dot-names and ``*.tmp`` never read); the run waits for new files (listing every
    ``follow_poll_s``) and ends after ``follow_idle_stop_s`` without any (default: never), on SIGTERM or at
    ``train.steps`` (``train.epochs``, if given, is 1: one pass). Every row is trained (no held-out split;
    evaluation is progressive, and ``eval_paths``).
    """

    source: str = field(
        default="synthetic", metadata=choices("synthetic", "criteo", "movielens", "converted", "parquet")
    )
    paths: list[str] = field(default_factory=list)
    eval_paths: list[str] = field(default_factory=list)
    holdout_every: int = field(default=10, metadata={"minimum": 2})
    strict: bool = False
    num_workers: int = field(default=0, metadata=non_negative())
    prefetch: int = field(default=2, metadata=non_negative())
    num_batches: int | None = field(default=None, metadata=positive())
    ids_per_feature: list[int] = field(default_factory=lambda: [1, 1])
    distribution: str = field(default="uniform", metadata=choices("uniform", "zipf"))
    zipf_alpha: float = field(default=1.1, metadata=positive())
    signal: float = field(default=2.0, metadata=positive())
    threshold: float = 4.0
    label_column: str = "label"
    dense_columns: list[str] = field(default_factory=list)
    sparse_columns: list[str] = field(default_factory=list)
    shuffle: bool = False
    follow: bool = False
    follow_poll_s: float = field(default=1.0, metadata=positive())
    follow_idle_stop_s: float | None = field(default=None, metadata=positive())


@dataclass
class OptimizerConfig:
    """The fused embedding optimizer (runs inside backward), the dense parameters' optimizer, the schedule.

    ``sparse_eps`` / ``sparse_weight_decay``: the fused optimizer's eps and weight decay (TorchRec's
    ``fused_params``; on CPU FBGEMM's SGD/Adagrad/row-wise Adagrad ignore the weight decay, with a
    warning, and only ``adam`` applies it). ``max_grad_norm`` clips the dense gradients' total norm
    (embeddings update inside backward, unclipped).
    The learning-rate schedule scales ``sparse_lr`` and ``dense_lr`` alike: linear warm-up from
    ``warmup_start`` (a fraction of the rate) over ``warmup_steps``, then ``decay`` (``constant``,
    ``linear``, ``polynomial`` with ``decay_power``, ``cosine``) from ``decay_start`` (default: the end of
    warm-up) over ``decay_steps`` (default: to ``train.steps``) down to ``min_lr_ratio`` of the rate.
    """

    sparse: str = field(default="rowwise_adagrad", metadata=choices(*SPARSE_OPTIMIZERS))
    sparse_lr: float = field(default=0.05, metadata=positive())
    sparse_eps: float = field(default=1e-8, metadata=positive())
    sparse_weight_decay: float = field(default=0.0, metadata=non_negative())
    dense: str = field(default="adagrad", metadata=choices(*DENSE_OPTIMIZERS))
    dense_lr: float = field(default=0.05, metadata=positive())
    dense_weight_decay: float = field(default=0.0, metadata=non_negative())
    max_grad_norm: float | None = field(default=None, metadata=positive())
    warmup_steps: int = field(default=0, metadata=non_negative())
    warmup_start: float = field(default=0.0, metadata=non_negative())
    decay: str = field(default="constant", metadata=choices(*DECAYS))
    decay_start: int | None = field(default=None, metadata=non_negative())
    decay_steps: int | None = field(default=None, metadata=positive())
    decay_power: float = field(default=2.0, metadata=positive())
    min_lr_ratio: float = field(default=0.0, metadata=non_negative())


@dataclass
class PlannerConfig:
    """How tables are sharded: a ``plan_file`` (ShardingPlan JSON), or the planner with these options.

    ``ddr_cap_gb`` / ``hbm_cap_gb``: memory per rank (default: detected). ``sharding_types``: the types the
    planner may choose for every table (default: all).

    ``memory_plan``: place each table in RAM or on disk (``storage``) within a rank's memory budget,
    ``memory_budget_gb`` (default: the host's cgroup limit, else MemAvailable, shared among its ranks), of
    which ``fixed_memory_gb`` is kept for everything but the tables (``rectrain.planner.memory_budget``).
    """

    plan_file: str | None = None
    local_world_size: int | None = field(default=None, metadata=positive())
    ddr_cap_gb: float | None = field(default=None, metadata=positive())
    hbm_cap_gb: float | None = field(default=None, metadata=positive())
    sharding_types: list[str] | None = None
    max_search_evaluations: int = field(default=256, metadata=positive())
    memory_plan: bool = False
    memory_budget_gb: float | None = field(default=None, metadata=positive())
    fixed_memory_gb: float = field(default=0.5, metadata=non_negative())


@dataclass
class TrainConfig:
    """The loop: per-rank batch size, length (``steps`` or ``epochs``), evaluation and logging cadence.

    ``eval_every = 0`` evaluates only at the end; ``metrics_log`` is a JSON-lines file (rank 0 writes it), the
    record of the run; ``tensorboard_dir`` also sends its metrics to TensorBoard (needs ``tensorboard``).
    ``collective_timeout_s``: how long a rank waits for its peers in a collective before it fails with an
    error naming the ranks that did not arrive (a hung or dead rank).

    ``progressive`` (default: on with ``data.follow``): score every batch before training on it (the training
    forward's logits) and log AUC and NE over the last ``progressive_window`` examples of all ranks (default:
    100,000 or one batch of every rank, whichever is more) at every ``log_every`` step
    (``rectrain.train.progressive``). ``metrics_port``: rank 0 serves Prometheus metrics (``rectrain_step``,
    ``rectrain_progressive_auc``, ...) on this port.

    ``disk_tables_dir``: where tables with ``storage = "disk"`` keep their working files (default
    ``$RECTRAIN_DISK_TABLES_DIR``, else ``<tmp>/rectrain-disk-tables``; local disk). ``disk_cache_mb``:
    the RAM row cache of each disk kernel, rows with their optimizer state (default: 10% of each disk
    table's rows; ``planner.memory_plan`` sizes each table's cache itself). See docs/disk-tables.md.
    ``row_counts``: count the lookups of every row of the sharded tables (an int32 per row, on the rank that
    owns the row), saved in checkpoints for ``recserve export --prune`` (``rectrain.distributed.sharded.
    row_counts``; its cost is measured by ``python -m bench prune``).
    """

    batch_size: int = field(default=512, metadata=positive())
    steps: int | None = field(default=None, metadata=positive())
    epochs: int | None = field(default=None, metadata=positive())
    eval_every: int = field(default=0, metadata=non_negative())
    eval_batches: int = field(default=10, metadata=positive())
    seed: int = field(default=0, metadata=non_negative())
    pipeline: bool = True
    log_every: int = field(default=10, metadata=positive())
    metrics_log: str | None = None
    tensorboard_dir: str | None = None
    device: str = field(default="auto", metadata=choices("auto", "cpu", "cuda"))
    recall_k: int = field(default=10, metadata=positive())
    collective_timeout_s: float = field(default=600.0, metadata=positive())
    progressive: bool | None = None
    progressive_window: int | None = field(default=None, metadata=positive())
    metrics_port: int | None = field(default=None, metadata=positive())
    disk_tables_dir: str | None = None
    disk_cache_mb: float | None = field(default=None, metadata=non_negative())
    row_counts: bool = True


@dataclass
class CheckpointConfig:
    """Where and how often to checkpoint; ``every_n_steps = 0`` saves only at the end (and on SIGTERM).

    ``dir = ""`` turns saving off. ``keep_last`` counts the most recently saved checkpoints. With ``resume =
    false`` a directory that already holds checkpoints is refused unless ``overwrite`` (``rectrain train
    --overwrite``), which deletes them at the start; so is a resume on other data than the checkpoints'
    (``data.paths`` or their sizes). ``overwrite`` starts afresh on the job's first attempt; torchrun's
    restarts of it (``TORCHELASTIC_RESTART_COUNT`` > 0) resume from what the earlier attempt saved.
    """

    dir: str | None = None
    every_n_steps: int = field(default=0, metadata=non_negative())
    keep_last: int = field(default=3, metadata=positive())
    resume: bool = True
    overwrite: bool = False


PUBLISH_TABLE_DTYPES = ("int8", "int4", "int2", "fp16", "fp32")
PUBLISH_DENSE_DTYPES = ("fp32", "bf16", "fp16")


@dataclass
class PublishConfig:
    """Publishing for servers that follow training (``recserve serve --follow DIR``): every ``every_seconds``
    a delta of the rows trained since the last one, every ``base_every`` deltas (and at the start) a base
    package exported from a checkpoint (so ``checkpoint.dir`` is needed). ``dtype``, ``dense_dtype``,
    ``model_name`` and ``max_auc_drop`` are ``recserve export``'s options for the bases; deltas follow them.
    ``dir = ""`` or no dir: no publishing."""

    dir: str | None = None
    every_seconds: float = field(default=10.0, metadata=positive())
    base_every: int = field(default=100, metadata=positive())
    dtype: str = field(default="int8", metadata=choices(*PUBLISH_TABLE_DTYPES))
    dense_dtype: str = field(default="fp32", metadata=choices(*PUBLISH_DENSE_DTYPES))
    model_name: str = "model"
    max_auc_drop: float = field(default=0.005, metadata=non_negative())


@dataclass
class RunConfig:
    """A whole run: ``RunConfig.load("run.toml", overrides=["train.steps=50"])``."""

    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    source: str = "<config>"

    @classmethod
    def load(cls, path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
        """Read and check ``path`` (TOML) with ``overrides`` applied; ``ConfigError`` names what is wrong."""
        path = Path(path)
        raw = load_toml(path)
        return cls.from_dict(apply_overrides(raw, overrides), source=path.name)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "<config>") -> RunConfig:
        """Check a parsed TOML document; ``source`` (the file name) prefixes every error message."""
        from rectrain.models.config import ModelConfig

        sections = {
            "data": DataConfig,
            "optimizer": OptimizerConfig,
            "planner": PlannerConfig,
            "train": TrainConfig,
            "checkpoint": CheckpointConfig,
            "publish": PublishConfig,
        }
        for key in raw:
            if key != "model" and key not in sections:
                raise ConfigError(f"{source}: {key}: {unknown_key_message(key, ['model', *sections])}")
        if "model" not in raw:
            raise ConfigError(f"{source}: model: missing; the [model] section is required")
        try:
            model = ModelConfig.from_dict(raw["model"], where="model")
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        parsed = {k: read_section(c, raw.get(k, {}), where=k, source=source) for k, c in sections.items()}
        config = cls(model=model, source=source, **parsed)
        config.validate()
        return config

    def lr_schedule(self) -> LRSchedule:
        """The learning-rate schedule of ``[optimizer]`` (validated: decay has a length)."""
        opt = self.optimizer
        decay_steps = opt.decay_steps
        start = opt.warmup_steps if opt.decay_start is None else opt.decay_start
        if decay_steps is None:
            decay_steps = max(1, (self.train.steps or 0) - start)
        return LRSchedule(
            warmup_steps=opt.warmup_steps,
            warmup_start=opt.warmup_start,
            decay=opt.decay,
            decay_start=start,
            decay_steps=decay_steps,
            decay_power=opt.decay_power,
            min_lr_ratio=opt.min_lr_ratio,
        )

    def _validate_schedule(self) -> None:
        opt, src = self.optimizer, self.source
        if opt.decay != "constant" and opt.decay_steps is None and self.train.steps is None:
            raise ConfigError(
                f"{src}: optimizer.decay_steps: needed with decay = {opt.decay!r} when the run is given "
                "in epochs (train.steps sets it otherwise)"
            )
        if opt.warmup_start > 1 or opt.min_lr_ratio > 1:
            raise ConfigError(f"{src}: optimizer.warmup_start and min_lr_ratio are fractions in [0, 1]")

    def validate(self) -> None:
        """Checks that span keys (each key's own type was checked when read)."""
        self._validate_schedule()
        data, train, src = self.data, self.train, self.source
        if train.steps is not None and train.epochs is not None:
            raise ConfigError(f"{src}: train: give steps or epochs, not both")
        if data.follow:
            self._validate_follow()
        elif train.steps is None and train.epochs is None:
            raise ConfigError(f"{src}: train: give steps (an int) or epochs (an int)")
        self._validate_progressive()
        if data.source != "synthetic" and not data.paths:
            raise ConfigError(f"{src}: data.paths: {data.source} needs at least one file")
        if data.source == "synthetic" and (data.paths or data.eval_paths):
            raise ConfigError(f"{src}: data.paths: synthetic data reads no files; remove paths")
        if len(data.ids_per_feature) != 2 or not 0 <= data.ids_per_feature[0] <= data.ids_per_feature[1]:
            raise ConfigError(
                f"{src}: data.ids_per_feature: expected [lo, hi] with 0 <= lo <= hi, "
                f"got {data.ids_per_feature}"
            )
        for name in self.planner.sharding_types or []:
            if name not in SHARDING_TYPES:
                raise ConfigError(
                    f"{src}: planner.sharding_types: {name!r} is not one of {', '.join(SHARDING_TYPES)}"
                )
        if train.metrics_log == "":
            raise ConfigError(
                f'{src}: train.metrics_log: "" is not a file; give a path such as "runs/metrics.jsonl", '
                "or leave the key out to write no log"
            )
        if self.checkpoint.every_n_steps and self.checkpoint.dir is None:  # dir = "" turns saving off
            raise ConfigError(f"{src}: checkpoint.every_n_steps is set but checkpoint.dir is not")
        if self.publish.dir and not self.checkpoint.dir:
            raise ConfigError(
                f"{src}: publish.dir is set but checkpoint.dir is not: bases are exported from checkpoints"
            )

    @property
    def progressive(self) -> bool:
        """Whether each batch is scored before it is trained on (``train.progressive``; default: follow)."""
        on = self.train.progressive
        return self.data.follow if on is None else on

    def _validate_follow(self) -> None:
        data, train, src = self.data, self.train, self.source
        if data.source == "synthetic":
            raise ConfigError(f"{src}: data.follow: synthetic data has no files to follow; set data.source")
        if len(data.paths) != 1:
            count = len(data.paths)
            raise ConfigError(f"{src}: data.paths: data.follow reads one directory, got {count} paths")
        if train.epochs not in (None, 1):  # 1: the one pass of a followed directory, what it always does
            raise ConfigError(
                f"{src}: train.epochs: a followed directory is one pass (each file read once); remove epochs "
                "or set it to 1 (run until SIGTERM, data.follow_idle_stop_s or train.steps)"
            )
        if train.eval_every and not data.eval_paths:
            raise ConfigError(
                f"{src}: train.eval_every: data.follow trains on every row (evaluation is progressive); give "
                "data.eval_paths to also evaluate on held-out files, or set eval_every = 0"
            )
        if data.follow_poll_s >= train.collective_timeout_s / 2:
            raise ConfigError(
                f"{src}: data.follow_poll_s: {data.follow_poll_s} s is too close to "
                f"train.collective_timeout_s ({train.collective_timeout_s} s): ranks with data wait that "
                "long for a polling peer"
            )

    def _validate_progressive(self) -> None:
        src, port = self.source, self.train.metrics_port
        if self.progressive and self.model.kind == "two_tower":
            raise ConfigError(
                f"{src}: train.progressive: a two-tower model's training logits are in-batch softmax scores, "
                "not click predictions; set train.progressive = false"
            )
        if port is not None and port > 65535:
            raise ConfigError(f"{src}: train.metrics_port: {port} is not a TCP port (1..65535)")
