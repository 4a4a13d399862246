"""``TrainJob``: the training job behind ``rectrain train`` (one process, or one rank under torchrun).

Before the first step every configured path is checked (``preflight``) and the checkpoint directory is
tidied; a resume loads the latest checkpoint and continues the data at its global position. Per step: the
pipeline trains one batch (``TrainPipelineSparseDist`` overlaps the next batch's load and input all-to-all;
``TrainPipelineBase`` with ``train.pipeline = false``), the reporter updates the bar and the JSON-lines log,
and at their cadences the run evaluates on the held-out split and checkpoints. SIGTERM stops the run at the
next step boundary with a checkpoint (no final evaluation: the grace period is short). At the end: the final
checkpoint, then the final evaluation. A failing evaluation is logged and the run goes on; a failure to read
the training data checkpoints the last step before it ends the run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rectrain.distributed import ShardingEnv
from rectrain.distributed.comm.timeouts import CollectiveTimeoutError
from rectrain.errors import ConfigError, TrainingDiverged
from rectrain.train import checkpointing
from rectrain.train.build import TrainingModel, build_training
from rectrain.train.checkpointing import Position
from rectrain.train.config import RunConfig
from rectrain.train.data import RunData, first_batches
from rectrain.train.dense_range import DenseRange
from rectrain.train.evaluate import evaluate
from rectrain.train.guard import DivergenceGuard
from rectrain.train.pipeline import TrainPipelineBase, TrainPipelineSparseDist
from rectrain.train.preflight import check_converted_parts, check_run_paths
from rectrain.train.progress import ProgressReporter
from rectrain.train.progressive import OnlineMetrics
from rectrain.train.publish import Publisher
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
    eval_error: str | None = None
    checkpoint: Path | None = None
    stopped_by_signal: bool = False

    @property
    def examples_per_s(self) -> float:
        """Training examples per second of this run (all ranks; evaluation and checkpoints included)."""
        trained = self.end.examples - self.start.examples
        return trained / self.seconds if self.seconds > 0 else 0.0


def _world(env: ShardingEnv | None) -> tuple[int, int]:
    return (0, 1) if env is None else (env.rank, env.world_size)


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
        self.dense_range = DenseRange()
        self.progress_bar = progress_bar
        self._saved_step: int | None = None
        publishing = bool(config.publish.dir)
        self.publisher = Publisher(config, self.training.model, env, self.agreement) if publishing else None

    def evaluate(self) -> dict[str, float]:
        """Metrics on the held-out split (collective: every rank calls it at the same point)."""
        t, k = self.training, self.config.train.recall_k
        return evaluate(t.prediction_model, self.data.eval_batches(), t.device, self.agreement, recall_k=k)

    def _batches(self, position: Position, stop: StopSignal) -> AgreedBatches:
        stream = self.dense_range.observe(self.data.train_batches(position.data))
        if self.publisher is not None:
            stream = self.publisher.observe(stream)
        steps = self.config.train.steps
        if steps is not None:  # exactly the batches left, so the pipeline never loads one past the end
            stream = first_batches(stream, max(0, steps - position.step))
        return AgreedBatches(stream, self.agreement, stop, keyed=self.config.data.follow)

    def _preflight(self) -> None:
        """Every configured path checked on every rank before anything trains (converted parts' sha256 shared
        out between the ranks); all ranks fail together."""
        self.attempt = self.agreement.most(checkpointing.restart_count())
        ckpt = self.config.checkpoint
        if self.attempt and ckpt.overwrite and ckpt.resume:  # a restart resumes what the first attempt saved
            self.config = replace(self.config, checkpoint=replace(ckpt, overwrite=False))
        error: ConfigError | None = None
        try:
            check_run_paths(self.config)
            check_converted_parts(self.config, self.rank, self.world_size)
        except ConfigError as e:
            error = e
        if self.agreement.any_rank(error is not None):
            raise error or ConfigError("a path check failed on another rank (see its error)")
        checkpointing.prepare_directory(self.config, self.env)

    def run(self) -> TrainSummary:
        self._preflight()  # may drop checkpoint.overwrite (a restart): read the config after it
        cfg, t = self.config, self.training
        position = checkpointing.resume(cfg, t, self.env, self.data.initial_position(), self.dense_range)
        self.online = OnlineMetrics(cfg, self.env, self.agreement)  # progressive window, Prometheus
        reporter = ProgressReporter(
            total_steps=cfg.train.steps,
            start_step=position.step,
            start_examples=position.examples,
            log_every=cfg.train.log_every,
            metrics_log=cfg.train.metrics_log,
            enabled=self.rank == 0,
            bar=self.progress_bar,
            tensorboard_dir=cfg.train.tensorboard_dir,
        )
        if position.step or self.attempt:  # where the log's steps start again (a failed attempt logged more)
            reporter.write({"event": "resume", "step": position.step, "attempt": self.attempt})
        pipeline_type = TrainPipelineSparseDist if cfg.train.pipeline else TrainPipelineBase
        pipeline = pipeline_type(t.model, t.optimizer, t.device)
        # Which kernel updates the tables: recorded, since the two sum a row's gradients in different orders.
        reporter.write({"event": "cpu_backward", "step": position.step, **t.cpu_backward.to_dict()})
        summary = TrainSummary(start=position, end=position)
        self._saved_step = position.step if position.step else None
        self.guard = DivergenceGuard(self.agreement, last_good_step=self._saved_step)
        self._position, self._evaluated_step = position, None
        self._cut = lambda: self._checkpoint(self._position, reporter)  # a base for publishing
        if self.publisher is not None:
            self.publisher.start(position.step, self._cut)
        start_time = time.perf_counter()
        try:
            with StopSignal() as stop:
                self._loop(pipeline, self._batches(position, stop), reporter, summary)
            summary.seconds = time.perf_counter() - start_time
            self._finish(reporter, summary)
        finally:
            reporter.close(self._position.step)
            self.online.close()
        summary.end = self._position
        return summary

    def _finish(self, reporter: ProgressReporter, summary: TrainSummary) -> None:
        """The final checkpoint, then the final evaluation: nothing trained is lost to an evaluation that
        fails or never ends. On SIGTERM only the checkpoint (the grace period is short)."""
        step = self._position.step
        reporter.flush(step)
        final_eval = self.data.evaluates and not (self._evaluated_step == step or summary.stopped_by_signal)
        path = self._checkpoint(self._position, reporter, good=not final_eval)
        summary.checkpoint = path or summary.checkpoint
        if self.publisher is not None:
            self.publisher.finish(step, self._cut, wait_for_base=not summary.stopped_by_signal)
        if final_eval:
            self._final_evaluation(step, reporter, summary)

    def _loop(
        self,
        pipeline: TrainPipelineBase,
        batches: AgreedBatches,
        reporter: ProgressReporter,
        summary: TrainSummary,
    ) -> None:
        cfg = self.config
        every_eval, every_ckpt = cfg.train.eval_every, cfg.checkpoint.every_n_steps
        while True:
            position = self._position
            self.lr.apply(position.step)
            try:
                output = pipeline.progress(batches)
            except StopIteration:  # the data ended, or a stop was agreed while waiting for data
                summary.stopped_by_signal = batches.stop_agreed
                return
            except Exception:
                if batches.failed and position.step:  # every rank failed to read: keep what was trained
                    logger.error("reading the next batch failed; checkpointing step %d first", position.step)
                    self._checkpoint(position, reporter)
                raise
            rows, data = batches.trained()
            position = self._position = Position(position.step + 1, position.examples + rows, data)
            loss = _loss_of(output)
            reporter.on_step(position.step, loss, position.examples)
            self.online.after_step(position, output, reporter)
            # On a GPU the loss is read back at the logging steps only (the guard settles before every
            # evaluation and checkpoint too), not every step.
            self.guard.check_loss(position.step, loss, settle=position.step % cfg.train.log_every == 0)
            if every_eval and position.step % every_eval == 0:
                self._evaluate(position.step, reporter, summary)
            if batches.stop_agreed:
                logger.warning(
                    "stop requested (SIGTERM): checkpointing at step %d and exiting", position.step
                )
                summary.stopped_by_signal = True
                return
            if every_ckpt and position.step % every_ckpt == 0:
                summary.checkpoint = self._checkpoint(position, reporter)
            if self.publisher is not None:
                self.publisher.after_step(position.step, self._cut)

    def _evaluate(self, step: int, reporter: ProgressReporter, summary: TrainSummary) -> None:
        """Evaluate and report; a failing evaluation is logged and the run goes on (training is not lost)."""
        self._evaluated_step = step
        self.guard.settle()
        try:
            metrics = self.evaluate()
        except (CollectiveTimeoutError, TrainingDiverged):
            raise
        except Exception as e:
            summary.eval_error = f"{type(e).__name__}: {e}".splitlines()[0]
            logger.error("evaluation at step %d failed, training goes on: %s", step, summary.eval_error)
            reporter.write({"event": "eval_failed", "step": step, "error": summary.eval_error})
            return
        summary.eval_metrics, summary.eval_error = {"step": step, **metrics}, None
        reporter.on_eval(step, summary.eval_metrics)
        self.guard.check_eval(step, summary.eval_metrics)

    def _final_evaluation(self, step: int, reporter: ProgressReporter, summary: TrainSummary) -> None:
        try:
            self._evaluate(step, reporter, summary)
        except TrainingDiverged as e:
            saved = f"; the final checkpoint (step {step}) was written before this evaluation"
            raise TrainingDiverged(f"{e}{saved if self._saved_step == step else ''}") from None
        if self._saved_step == step:
            self.guard.saved(step)

    def _checkpoint(self, position: Position, reporter: ProgressReporter, good: bool = True) -> Path | None:
        """Save ``position`` unless it is already saved (or checkpointing is off); ``good=False`` before the
        evaluation that would tell the guard otherwise."""
        if position.step == self._saved_step:
            return None
        self.guard.settle()  # never save the state a not-yet-read loss says diverged
        if self.publisher is not None:
            self.publisher.wait_for_export()
        dense_range = self.dense_range.gathered(self.env, self.training.device)
        path = checkpointing.save(self.config, self.training, self.env, position, dense_range)
        self._saved_step = position.step
        if path is not None:
            if good:
                self.guard.saved(position.step)
            reporter.write({"event": "checkpoint", "step": position.step, "path": str(path)})
        return path
