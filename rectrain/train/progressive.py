"""Progressive validation and live metrics of a run: every batch scored before it is trained on.

The training forward's logits are the model's scores before the update that batch causes (the optimizer
steps after backward), so they are kept (``sigmoid`` of them, with the labels) in a sliding window of the
latest ``train.progressive_window`` examples of the job (``WindowedMetrics``, the windowed ``AUCMetric``
and ``NEMetric``: ``window / W`` per rank, which must hold a batch) at no extra forward. At every
``train.log_every`` step the ranks gather their windows (one all-gather, at log steps only) and rank 0
logs ``{"event": "progressive", "step", "auc", "ne", "log_loss", "num_examples"}`` to the metrics log and
TensorBoard. With ``train.metrics_port`` rank 0 also exports them, with the step and the
examples trained, as Prometheus gauges (``rectrain.train.prometheus``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rectrain.distributed import ShardingEnv
from rectrain.errors import ConfigError
from rectrain.metrics import WindowedMetrics
from rectrain.train.checkpointing import Position
from rectrain.train.config import RunConfig
from rectrain.train.progress import ProgressReporter
from rectrain.train.prometheus import MetricsExporter
from rectrain.train.sync import RankAgreement

DEFAULT_WINDOW = 100_000  # examples, when train.progressive_window is not given (and a batch per rank fits)


class OnlineMetrics:
    """The run's progressive window and Prometheus gauges (each only when configured)."""

    def __init__(self, config: RunConfig, env: ShardingEnv | None, agreement: RankAgreement) -> None:
        """Collective: rank 0 opens the metrics port and every rank learns whether that failed."""
        rank, world_size = (0, 1) if env is None else (env.rank, env.world_size)
        self.log_every = config.train.log_every
        self.window: WindowedMetrics | None = None
        if config.progressive:
            window, batch = config.train.progressive_window, config.train.batch_size
            window = window or max(DEFAULT_WINDOW, batch * world_size)
            if math.ceil(window / world_size) < batch:
                raise ConfigError(
                    f"{config.source}: train.progressive_window = {window} must hold a batch on every rank "
                    f"(train.batch_size {batch} x {world_size} ranks = {batch * world_size} examples or more)"
                )
            self.window = WindowedMetrics(window, world_size, batch)
        port, error = config.train.metrics_port, None
        self.exporter: MetricsExporter | None = None
        try:
            self.exporter = MetricsExporter(port) if port is not None and rank == 0 else None
        except ConfigError as e:
            error = ConfigError(f"{config.source}: {e}")
        if agreement.any_rank(error is not None):  # no rank trains on into collectives rank 0 never joins
            raise error or ConfigError(f"{config.source}: train.metrics_port: rank 0 could not serve metrics")

    def after_step(self, position: Position, output: Any, reporter: ProgressReporter) -> None:
        """After a trained step: ``output`` is the training model's ``(loss, (loss, logits, labels))``.
        At log steps a collective (every rank calls this at every step)."""
        if self.window is not None:
            _, logits, labels = output[1]
            self.window.update(torch.sigmoid(logits.float()), labels.float())
        if self.exporter is not None:
            self.exporter.set(step=position.step, examples=position.examples)
        if self.window is None or position.step % self.log_every:
            return
        metrics = self.window.compute()
        reporter.write({"event": "progressive", "step": position.step, **metrics})
        if self.exporter is not None:
            self.exporter.set(
                progressive_auc=metrics["auc"],
                progressive_ne=metrics["ne"],
                progressive_examples=metrics["num_examples"],
            )

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
