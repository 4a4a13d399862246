"""``TrainJob``: the training job behind ``rectrain train`` (one process, or one rank under torchrun).

Per step: the pipeline trains one batch (``TrainPipelineSparseDist`` overlaps the next batch's load and
input all-to-all; ``TrainPipelineBase`` with ``train.pipeline = false``), the reporter updates the bar and
the JSON-lines log, and at their cadences the run evaluates on the held-out split and checkpoints. SIGTERM
stops the run at the next step boundary with a checkpoint (no final evaluation: the grace period is short).
At the end: a final evaluation and checkpoint.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rectrain.distributed import ShardingEnv
from rectrain.train import checkpointing
from rectrain.train.build import TrainingModel, build_training
from rectrain.train.checkpointing import Position
from rectrain.train.config import RunConfig
from rectrain.train.data import RunData
from rectrain.train.evaluate import evaluate
from rectrain.train.guard import DivergenceGuard
from rectrain.train.pipeline import TrainPipelineBase, TrainPipelineSparseDist
from rectrain.train.progress import ProgressReporter
from rectrain.train.schedule import ScheduledLR
from rectrain.train.sync import AgreedBatches, RankAgreement, StopSignal

logger = logging.getLogger(__name__)


@dataclass
class TrainSummary:
    """What a run did: where it started and ended, its speed, its last evaluation and checkpoint."""

    start: Position
    end: Position
    seconds: float = 0.0
    eval_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    stopped_by_signal: bool = False

    @property
    def examples_per_s(self) -> float:
        """Training examples per second of this run (all ranks; evaluation and checkpoints included)."""
        trained = self.end.examples - self.start.examples
        return trained / self.seconds if self.seconds > 0 else 0.0


def _world(env: ShardingEnv | None) -> tuple[int, int]:
    return (0, 1) if env is None else (env.rank, env.world_size)


def _rows_of(output: Any, default: int) -> int:
    """Examples in the batch a training model's output ``(loss, (loss, logits, labels))`` came from."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], tuple):
        return int(output[1][-1].shape[0])
    return default


def _loss_of(output: Any) -> Any:
    return output[0] if isinstance(output, tuple) else output


class TrainJob:
    """A configured run on this rank; ``run()`` trains, evaluates and checkpoints as the config says."""

    def __init__(
        self, config: RunConfig, env: ShardingEnv | None = None, *, progress_bar: bool = True
    ) -> None:
        self.config, self.env = config, env
        self.rank, self.world_size = _world(env)
        self.training: TrainingModel = build_training(config, env)
        # Base rates read before a resume loads a checkpoint's: the configured rates win.
        self.lr = ScheduledLR(self.training.optimizer, config.lr_schedule())
        self.data = RunData(config, self.rank, self.world_size)
        self.agreement = RankAgreement(env)
        self.progress_bar = progress_bar
        self._saved_step: int | None = None

    def evaluate(self) -> dict[str, float]:
        """Metrics on the held-out split (collective: every rank calls it at the same point)."""
        t, k = self.training, self.config.train.recall_k
        return evaluate(t.prediction_model, self.data.eval_batches(), t.device, self.agreement, recall_k=k)

    def _batches(self, start: int, stop: StopSignal) -> AgreedBatches:
        stream = self.data.train_batches(start)
        steps = self.config.train.steps
        if steps is not None:  # exactly the batches left, so the pipeline never loads one past the end
            stream = itertools.islice(stream, max(0, steps - start))
        return AgreedBatches(stream, self.agreement, stop)

    def run(self) -> TrainSummary:
        cfg, t = self.config, self.training
        position = checkpointing.resume(cfg, t, self.env)
        reporter = ProgressReporter(
            total_steps=cfg.train.steps,
            start_step=position.step,
            start_examples=position.examples,
            log_every=cfg.train.log_every,
            metrics_log=cfg.train.metrics_log,
            enabled=self.rank == 0,
            bar=self.progress_bar,
        )
        pipeline_type = TrainPipelineSparseDist if cfg.train.pipeline else TrainPipelineBase
        pipeline = pipeline_type(t.model, t.optimizer, t.device)
        summary = TrainSummary(start=position, end=position)
        self._saved_step = position.step if position.step else None
        self.guard = DivergenceGuard(self.agreement, last_good_step=self._saved_step)
        start_time = time.perf_counter()
        try:
            with StopSignal() as stop:
                position = self._loop(
                    pipeline, self._batches(position.step, stop), position, reporter, summary
                )
            summary.seconds = time.perf_counter() - start_time
            reporter.flush(position.step)
            evaluated = summary.eval_metrics.get("step") == position.step
            if not (evaluated or summary.stopped_by_signal):  # on SIGTERM, save first and fast
                self._evaluate(position.step, reporter, summary)
            summary.checkpoint = self._checkpoint(position, reporter) or summary.checkpoint
        finally:
            reporter.close(position.step)
        summary.end = position
        return summary

    def _loop(
        self,
        pipeline: TrainPipelineBase,
        batches: AgreedBatches,
        position: Position,
        reporter: ProgressReporter,
        summary: TrainSummary,
    ) -> Position:
        cfg = self.config
        every_eval, every_ckpt = cfg.train.eval_every, cfg.checkpoint.every_n_steps
        while True:
            self.lr.apply(position.step)
            try:
                output = pipeline.progress(batches)
            except StopIteration:
                return position
            rows = _rows_of(output, cfg.train.batch_size) * self.world_size
            position = Position(position.step + 1, position.examples + rows)
            loss = _loss_of(output)
            reporter.on_step(position.step, loss, position.examples)
            self.guard.check_loss(position.step, loss)
            if every_eval and position.step % every_eval == 0:
                self._evaluate(position.step, reporter, summary)
            if batches.stop_agreed:
                logger.warning(
                    "stop requested (SIGTERM): checkpointing at step %d and exiting", position.step
                )
                summary.stopped_by_signal = True
                return position
            if every_ckpt and position.step % every_ckpt == 0:
                summary.checkpoint = self._checkpoint(position, reporter)

    def _evaluate(self, step: int, reporter: ProgressReporter, summary: TrainSummary) -> None:
        summary.eval_metrics = {"step": step, **self.evaluate()}
        reporter.on_eval(step, summary.eval_metrics)
        self.guard.check_eval(step, summary.eval_metrics)

    def _checkpoint(self, position: Position, reporter: ProgressReporter) -> Path | None:
        """Save ``position`` unless it is already saved (or checkpointing is off)."""
        if position.step == self._saved_step:
            return None
        path = checkpointing.save(self.config, self.training, self.env, position)
        self._saved_step = position.step
        if path is not None:
            self.guard.saved(position.step)
            reporter.write({"event": "checkpoint", "step": position.step, "path": str(path)})
        return path
