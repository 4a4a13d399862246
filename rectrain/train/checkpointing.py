"""The run's side of checkpoints: when to save, what position to record, and resuming from the latest one.

The checkpoint itself (sharded tables, optimizer state, manifest) is ``rectrain.checkpoint``'s job; a run
adds its data-loader position to ``extra``: ``{"step", "examples"}``. Every rank trains one batch per step,
so ``step`` is also how many batches of its stream each rank has consumed, and a resumed run skips them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from rectrain.distributed import ShardingEnv
from rectrain.train.build import TrainingModel
from rectrain.train.config import RunConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Position:
    """How far a run got: optimizer steps taken and examples trained on (all ranks)."""

    step: int = 0
    examples: int = 0


def has_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a complete checkpoint to resume from (its ``latest`` pointer exists)."""
    from rectrain.checkpoint.manifest import LATEST

    return (Path(directory) / LATEST).is_file()


def resume(config: RunConfig, training: TrainingModel, env: ShardingEnv | None) -> Position:
    """Load the latest checkpoint of ``checkpoint.dir`` when resuming is on and one exists; else step 0."""
    directory = config.checkpoint.dir
    if not directory or not config.checkpoint.resume or not has_checkpoint(directory):
        return Position()
    from rectrain.checkpoint import load_checkpoint

    info = load_checkpoint(directory, model=training.model, optimizer=training.optimizer, env=env)
    extra = info.extra or {}
    position = Position(step=int(extra.get("step", info.step)), examples=int(extra.get("examples", 0)))
    logger.info("resumed from %s at step %d (%d examples)", directory, position.step, position.examples)
    return position


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
        extra={"step": position.step, "examples": position.examples},
        env=env,
        keep_last=config.checkpoint.keep_last,
    )
