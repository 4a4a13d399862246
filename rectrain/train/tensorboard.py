"""Training metrics to TensorBoard (``train.tensorboard_dir``) beside the JSON-lines log, the record.

Every number of every event the log gets becomes a scalar ``EVENT/KEY`` at the event's step (``train/loss``,
``train/examples_per_s``, ``eval/auc``, ``eval/ne``, ``checkpoint/examples``, ...), stamped with the event's
time. A resumed run opens the directory with ``purge_step`` at its first new step, so TensorBoard hides what
a failed attempt logged past the checkpoint the run resumed from (the JSON-lines log keeps it, after a
``resume`` event). The ``tensorboard`` package is optional: ``pip install 'rectrain[tensorboard]'``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rectrain.errors import ConfigError

_NOT_SCALARS = ("event", "step", "time", "elapsed_s")


def summary_writer_class(key: str = "train.tensorboard_dir") -> Any:
    """``torch.utils.tensorboard.SummaryWriter``; ConfigError naming ``key`` if TensorBoard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch's writer imports the tensorboard package
        raise ConfigError(
            f"{key}: TensorBoard logs need the tensorboard package: pip install 'rectrain[tensorboard]' (or "
            "pip install tensorboard), or leave the key unset"
        ) from None
    return SummaryWriter


class TensorBoardLog:
    """One run's TensorBoard event file in ``directory``; ``write`` takes the JSON-lines log's records."""

    def __init__(self, directory: str | Path, start_step: int = 0) -> None:
        writer = summary_writer_class()
        purge = {"purge_step": start_step + 1} if start_step else {}
        self._writer = writer(log_dir=str(directory), **purge)

    def write(self, record: dict[str, Any]) -> None:
        event, step = record.get("event"), record.get("step")
        if not isinstance(event, str) or not isinstance(step, int):
            return
        for key, value in record.items():
            if key in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self._writer.add_scalar(f"{event}/{key}", value, step, walltime=record.get("time"))

    def close(self) -> None:
        self._writer.close()
