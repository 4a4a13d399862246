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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rectrain.datasets.windows import BATCHES, DataPosition
from rectrain.distributed import ShardingEnv
from rectrain.errors import ConfigError
from rectrain.train.build import TrainingModel
from rectrain.train.config import RunConfig

if TYPE_CHECKING:
    from rectrain.checkpoint import CheckpointInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Position:
    """How far a run got: optimizer steps taken, examples trained on (all ranks) and the data position."""

    step: int = 0
    examples: int = 0
    data: DataPosition = field(default_factory=DataPosition)


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
    and ``resume = false``, the old checkpoints. Other ranks do not touch the directory."""
    directory = config.checkpoint.dir
    if not directory or (env is not None and env.rank != 0) or not Path(directory).is_dir():
        return
    from rectrain.checkpoint.retention import remove_checkpoints, remove_leftovers

    root = Path(directory)
    if config.checkpoint.overwrite and not config.checkpoint.resume:
        removed = remove_checkpoints(root)
        if removed:
            logger.warning("checkpoint.overwrite: removed the old checkpoints of %s: %s", root, removed)
    remove_leftovers(root)


def resume(
    config: RunConfig, training: TrainingModel, env: ShardingEnv | None, initial: DataPosition
) -> Position:
    """Load the latest checkpoint of ``checkpoint.dir`` when resuming is on and one exists; else the start."""
    directory = config.checkpoint.dir
    if not directory or not config.checkpoint.resume or not has_checkpoint(directory):
        return Position(data=initial)
    from rectrain.checkpoint import load_checkpoint

    info = load_checkpoint(directory, model=training.model, optimizer=training.optimizer, env=env)
    extra = info.extra or {}
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
    config: RunConfig, training: TrainingModel, env: ShardingEnv | None, position: Position
) -> Path | None:
    """Write a checkpoint of ``position`` to ``checkpoint.dir`` (collective); None when no dir is set."""
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
            "cpu_backward": training.cpu_backward.to_dict(),
        },
        env=env,
        keep_last=config.checkpoint.keep_last,
        data_position=position.data.to_dict(),
    )
