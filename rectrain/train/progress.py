"""What a run reports as it goes: a progress bar for people (stderr) and a JSON-lines log for machines.

Only the reporting rank (rank 0) shows the bar and writes the log. Each log line is one event object:

    {"event": "train", "step": 50, "examples": 51200, "examples_per_s": 9812.4, "loss": 0.61, "time": ...}
    {"event": "eval", "step": 50, "examples": 51200, "auc": 0.71, "ne": 0.93, "log_loss": 0.6, ...}

and, once at the start, ``{"event": "cpu_backward", "kernel": "native", "reason": ...}``: the embedding
backward the run trains with, and why.

``loss`` is this rank's mean training loss since the previous train event; eval metrics are over every
rank's held-out examples. ``examples`` counts rows of this rank's batches times the world size. ``time`` is
seconds since the Unix epoch, ``elapsed_s`` seconds since training started. With ``tensorboard_dir`` the
events' numbers also go to TensorBoard (``tensorboard``); the log stays the record.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch
from torch import Tensor
from tqdm import tqdm

from rectrain.train.tensorboard import TensorBoardLog


class ProgressReporter:
    """Progress bar and JSON-lines metrics log of one run (a no-op on ranks other than the reporting one)."""

    def __init__(
        self,
        *,
        total_steps: int | None,
        start_step: int = 0,
        start_examples: int = 0,
        log_every: int = 10,
        metrics_log: str | Path | None = None,
        enabled: bool = True,
        bar: bool = True,
        tensorboard_dir: str | Path | None = None,
    ) -> None:
        self.enabled, self.log_every = enabled, log_every
        self._losses: list[Tensor] = []
        self._start = self._window_start = time.perf_counter()
        self._examples = self._window_examples = start_examples
        self._log: IO[str] | None = None
        self._bar: tqdm | None = None
        self._shown: dict[str, str] = {}
        self._tensorboard: TensorBoardLog | None = None
        if not enabled:
            return
        if tensorboard_dir:
            self._tensorboard = TensorBoardLog(tensorboard_dir, start_step)
        if metrics_log is not None:
            Path(metrics_log).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(metrics_log, "a", buffering=1)  # noqa: SIM115 (closed in close())
        if bar:
            self._bar = tqdm(
                total=total_steps, initial=start_step, unit="step", file=sys.stderr, dynamic_ncols=True
            )

    def on_step(self, step: int, loss: Tensor, examples: int) -> None:
        """After training step ``step`` (1-based); ``examples`` trained on so far, across ranks."""
        if not self.enabled:
            return
        self._losses.append(loss.detach())
        self._examples = examples
        if self._bar is not None:
            self._bar.update(1)
        if step % self.log_every == 0:
            self.flush(step)

    def flush(self, step: int) -> None:
        """Log the training window since the last train event (if it has any steps)."""
        if not self._losses:
            return
        now = time.perf_counter()
        loss = torch.stack(self._losses).float().mean().item()
        rate = (self._examples - self._window_examples) / max(now - self._window_start, 1e-9)
        self._losses, self._window_start, self._window_examples = [], now, self._examples
        self.write({"event": "train", "step": step, "examples_per_s": round(rate, 1), "loss": loss})
        if self._bar is not None:
            self._bar.set_postfix(self._postfix(loss=loss, ex_s=rate), refresh=False)

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        """After an evaluation at ``step``; ``metrics`` as ``MetricsComputer.compute`` returns them."""
        if not self.enabled:
            return
        self.write({"event": "eval", "step": step, **metrics})
        if self._bar is not None:
            self._bar.set_postfix(self._postfix(auc=metrics.get("auc"), ne=metrics.get("ne")), refresh=True)

    def _postfix(self, **values: float | None) -> dict[str, str]:
        for key, value in values.items():
            if value is not None and math.isfinite(value):
                self._shown[key] = f"{value:,.0f}" if key == "ex_s" else f"{value:.4f}"
        return self._shown

    def write(self, event: dict[str, Any]) -> None:
        """Append one event to the log (and its numbers to TensorBoard), stamped with examples so far and the
        time."""
        if not self.enabled:
            return
        record = {
            "event": event.get("event"),
            "step": event.get("step"),
            "examples": self._examples,
            **event,
            "elapsed_s": round(time.perf_counter() - self._start, 3),
            "time": round(time.time(), 3),
        }
        if self._log is not None:
            self._log.write(json.dumps(_finite(record)) + "\n")
        if self._tensorboard is not None:
            self._tensorboard.write(record)

    def close(self, step: int) -> None:
        """Log the last partial window and close the bar and the log."""
        if self.enabled:
            self.flush(step)
        if self._bar is not None:
            self._bar.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: undefined metrics (e.g. AUC of one class) become null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
