"""The run's side of checkpoints: preparing the directory, what position to record, resuming from the latest.

The checkpoint itself (sharded tables, optimizer state, manifest) is ``rectrain.checkpoint``'s job; a run adds
``extra = {"step", "examples", "cpu_backward"}`` (``cpu_backward``: the CPU embedding backward that trained it
and why) and the global data position (``data_position``, a ``DataPosition``: rows of the epoch consumed by
the whole job, or batches per rank for synthetic data). A resume on any number of ranks continues the data
there. A checkpoint without ``data_position`` (older rectrain) resumes as those versions
did, each rank skipping ``step`` batches of its stream, with a warning when the world size changed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rectrain.datasets.windows import BATCHES, DataPosition
from rectrain.distributed import ShardingEnv
from rectrain.errors import ConfigError, RecTrainError
from rectrain.train.build import TrainingModel
from rectrain.train.config import RunConfig
from rectrain.train.dense_range import KEY as DENSE_RANGE
from rectrain.train.dense_range import DenseRange

if TYPE_CHECKING:
    from rectrain.checkpoint import CheckpointInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Position:
    """How far a run got: optimizer steps taken, examples trained on (all ranks) and the data position."""

    step: int = 0
    examples: int = 0
    data: DataPosition = field(default_factory=DataPosition)


DATA = "data"  # the checkpoint's ``extra`` key recording the data it was trained on (``data_identity``)


def restart_count() -> int:
    """How often torchrun's agent on this host restarted the job after a failure (0: the first attempt). An
    agent whose workers did not fail keeps 0 when it restarts them for another host's: take the ranks' most.
    """
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def starts_afresh(config: RunConfig) -> bool:
    """Whether this run ignores the checkpoints in ``checkpoint.dir``: ``resume = false``, or ``overwrite``
    (which a job restarted by torchrun drops, to resume from what its earlier attempt saved: ``TrainJob``)."""
    ckpt = config.checkpoint
    return not ckpt.resume or ckpt.overwrite


def data_identity(config: RunConfig) -> dict:
    """What the run trains on, as its checkpoints record it: the source and each path with its size (a
    converted directory's rows), so a run resumed on other data is refused."""
    data = config.data
    if data.source == "synthetic":
        return {"source": data.source}
    if data.follow:  # the directory grows: its identity is its path (the position says what was read)
        return {"source": data.source, "follow": True, "paths": [[str(Path(data.paths[0]).absolute()), None]]}
    return {"source": data.source, "paths": [_path_identity(p, data.source) for p in data.paths]}


def _path_identity(path: str, source: str) -> list:
    where = Path(path).absolute()
    try:
        if source == "converted":
            from rectrain.datasets.columnar import ColumnarManifest

            return [str(where), ColumnarManifest.load(where)[0].num_rows]
        return [str(where), where.stat().st_size]
    except (OSError, RecTrainError):  # gone since the start: the checkpoint is still worth writing
        return [str(where), None]


def has_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a complete checkpoint to resume from (its ``latest`` pointer exists)."""
    from rectrain.checkpoint.manifest import LATEST

    return (Path(directory) / LATEST).is_file()


def saved_checkpoints(directory: str | Path) -> list[str]:
    """Names of the complete checkpoints (``step_N`` with a manifest) in ``directory``."""
    from rectrain.checkpoint.manifest import MANIFEST, STEP_PREFIX

    root = Path(directory)
    return sorted(p.name for p in root.glob(f"{STEP_PREFIX}*") if (p / MANIFEST).is_file())


def prepare_directory(config: RunConfig, env: ShardingEnv | None) -> None:
    """Rank 0, before the first step: clear leftovers of interrupted saves and, with ``checkpoint.overwrite``
    (``starts_afresh``), the old checkpoints. Other ranks do not touch the directory."""
    directory = config.checkpoint.dir
    if not directory or (env is not None and env.rank != 0) or not Path(directory).is_dir():
        return
    from rectrain.checkpoint.retention import remove_checkpoints, remove_leftovers

    root = Path(directory)
    if config.checkpoint.overwrite and starts_afresh(config):
        removed = remove_checkpoints(root)
        if removed:
            logger.warning("checkpoint.overwrite: removed the old checkpoints of %s: %s", root, removed)
    remove_leftovers(root)


def resume(
    config: RunConfig,
    training: TrainingModel,
    env: ShardingEnv | None,
    initial: DataPosition,
    dense_range: DenseRange | None = None,
) -> Position:
    """Load the latest checkpoint of ``checkpoint.dir`` when resuming is on and one exists; else the start.
    ``dense_range`` takes the range of dense features the checkpoint records."""
    directory = config.checkpoint.dir
    if not directory or starts_afresh(config) or not has_checkpoint(directory):
        return Position(data=initial)
    from rectrain.checkpoint import load_checkpoint

    info = load_checkpoint(directory, model=training.model, optimizer=training.optimizer, env=env)
    extra = info.extra or {}
    if dense_range is not None:
        dense_range.restore(extra.get(DENSE_RANGE))
    step = int(extra.get("step", info.step))
    world_size = 1 if env is None else env.world_size
    data = _data_position(info, step, world_size, initial, config.source)
    position = Position(step=step, examples=int(extra.get("examples", 0)), data=data)
    logger.info(
        "resumed from %s at step %d (%d examples; data: epoch %d, %s %d)",
        info.path,
        step,
        position.examples,
        data.epoch,
        data.unit,
        data.offset,
    )
    return position


def _data_position(
    info: CheckpointInfo, step: int, world_size: int, initial: DataPosition, source: str
) -> DataPosition:
    """Where the data continues: the manifest's ``data_position``, or per-rank batches for old checkpoints."""
    stored = info.manifest.data_position
    changed = info.saved_world_size != world_size
    saved = f"saved by {info.saved_world_size} ranks, resumed on {world_size}"
    if stored is None:
        if changed:
            logger.warning(
                "%s records no global data position (written by an older rectrain): each rank skips %d "
                "batches of its stream as before, but the checkpoint was %s, so some rows are trained twice "
                "or skipped",
                info.path,
                step,
                saved,
            )
        return DataPosition(0, step, BATCHES, initial.source)
    data = DataPosition.from_dict(stored, f"{info.path}/manifest.json: data_position")
    if data.source and data.source != initial.source:
        raise ConfigError(
            f"{source}: data.source: {info.path} was trained on {data.source!r} data, this run reads "
            f"{initial.source!r}; resume with the same data, or start afresh (checkpoint.resume = false)"
        )
    if data.unit == BATCHES and changed:
        logger.warning(
            "%s: synthetic batches are made per rank, so the resumed stream (%s) continues at batch %d of "
            "each rank's own stream",
            info.path,
            saved,
            data.offset,
        )
    return data


def save(
    config: RunConfig,
    training: TrainingModel,
    env: ShardingEnv | None,
    position: Position,
    dense_range: dict | None = None,
) -> Path | None:
    """Write a checkpoint of ``position`` to ``checkpoint.dir`` (collective); None when no dir is set.
    ``dense_range`` (``DenseRange.gathered``) is recorded for export's serving bound."""
    directory = config.checkpoint.dir
    if not directory:
        return None
    from rectrain.checkpoint import save_checkpoint

    return save_checkpoint(
        directory,
        model=training.model,
        optimizer=training.optimizer,
        step=position.step,
        model_config=config.model,
        extra={
            "step": position.step,
            "examples": position.examples,
            DATA: data_identity(config),
            "cpu_backward": training.cpu_backward.to_dict(),
            **({DENSE_RANGE: dense_range} if dense_range else {}),
        },
        env=env,
        keep_last=config.checkpoint.keep_last,
        data_position=position.data.to_dict(),
    )
