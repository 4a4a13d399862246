"""``MetricsComputer``: the job's evaluation metrics, computed by the ``RecMetric`` engine.

An adapter, not a second implementation: batches go to ``AUCMetric``, ``NEMetric`` (with log loss),
``AccuracyMetric`` and ``CalibrationMetric`` for one task, and ``compute`` reads their values under the
metrics log's names (``auc``, ``ne``, ``log_loss``, ``accuracy``, ``calibration``, ``num_examples``). So the
job's reported numbers are ``RecMetricModule``'s on the same predictions. Two conventions are the log's:
``log_loss`` is in nats (TorchRec's ``logloss`` is in bits) and a metric that is undefined on what was seen
(AUC or NE without both classes, calibration without positives, anything of nothing) is NaN, not
TorchRec's placeholder (0.5, 0).

Memory (on the device of the predictions): NE, log loss, accuracy and calibration are running sums; AUC
keeps the examples (by default all of them: exact AUC over the pass; with ``auc_window=N`` each rank's
latest N, TorchRec's windowed AUC).

``compute(pg)`` is a collective when ``torch.distributed`` is initialised: every rank of ``pg`` (default: the
world) must call it; sums are all-reduced and AUC examples all-gathered, so every value is over the union
of the ranks' examples and every rank gets the same result.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.metrics.accuracy import AccuracyMetric
from rectrain.metrics.auc import AUCMetric
from rectrain.metrics.calibration import CalibrationMetric
from rectrain.metrics.metrics_config import DefaultTaskInfo
from rectrain.metrics.ne import NEMetric
from rectrain.metrics.rec_metric import RecMetricComputation, RecMetricList

#: The window of metrics that keep everything: more examples than any job sees.
KEEP_ALL = 2**62
LN2 = math.log(2.0)


class MetricsComputer:
    """Binary-classification metrics over a stream of batches: auc, ne, log_loss, accuracy, calibration."""

    def __init__(self, auc_window: int | None = None, threshold: float = 0.5) -> None:
        if auc_window is not None and auc_window < 1:
            raise ValueError(f"auc_window must be None (keep all) or >= 1, got {auc_window}")
        self.auc_window = auc_window
        self.threshold = threshold
        common = dict(
            world_size=1, my_rank=0, batch_size=1, tasks=[DefaultTaskInfo], compute_on_all_ranks=True
        )
        self._metrics = RecMetricList(
            [
                AUCMetric(window_size=auc_window or KEEP_ALL, no_signal_value=math.nan, **common),
                NEMetric(window_size=KEEP_ALL, include_logloss=True, **common),
                AccuracyMetric(window_size=KEEP_ALL, threshold=threshold, **common),
                CalibrationMetric(window_size=KEEP_ALL, **common),
            ]
        )

    def reset(self) -> None:
        """Forget everything seen so far (e.g. at the start of an evaluation pass)."""
        self._metrics.reset()

    @property
    def stored_examples(self) -> int:
        """Examples this rank holds for AUC (at most ``auc_window``)."""
        return self._metrics[0]._metrics_computations[0]._num_samples

    @torch.no_grad()
    def update(self, predictions: Tensor, labels: Tensor) -> None:
        """Add a batch: ``predictions`` are probabilities in [0, 1], ``labels`` 0/1, same shape."""
        update_binary(self._metrics, predictions, labels)

    @torch.no_grad()
    def compute(self, pg: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Metrics over all ranks of ``pg`` when distributed is initialised, else over this process."""
        ne = self._metrics[1]._metrics_computations[0]
        values, (count, pos, neg) = synced_values(self._metrics, ne, "", pg)
        nan = math.nan
        return {
            "auc": values["window_auc"],
            "ne": values["lifetime_ne"] if pos > 0 and neg > 0 else nan,
            "log_loss": values["lifetime_logloss"] * LN2 if count else nan,
            "accuracy": values["lifetime_accuracy"] if count else nan,
            "calibration": values["lifetime_calibration"] if pos > 0 else nan,
            "num_examples": count,
        }


def update_binary(metrics: RecMetricList, predictions: Tensor, labels: Tensor) -> None:
    """One batch of the default task. The states live where the predictions are (moved there with the
    first batch), so that an update on a GPU never waits for the host."""
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ")
    if metrics[0]._metrics_computations[0].device != predictions.device:
        metrics.to(predictions.device)
    task = DefaultTaskInfo.name
    p = predictions.detach().reshape(-1).to(torch.float64)
    y = labels.detach().reshape(-1).to(p.device, torch.float64)
    metrics.update(predictions={task: p}, labels={task: y}, weights=None)


def synced_values(
    metrics: RecMetricList, ne: RecMetricComputation, scope: str, pg: dist.ProcessGroup | None
) -> tuple[dict[str, float], tuple[float, float, float]]:
    """Every value of ``metrics`` over all ranks of ``pg`` keyed ``{prefix}{name}`` (``window_auc``), and the
    example count, positive and negative label sums of ``ne``'s ``scope`` states (``""`` or ``"window_"``)."""
    if pg is not None and not dist.is_initialized():
        raise ValueError("compute(pg=...) was given a process group but torch.distributed is not initialised")
    computations = [c for metric in metrics.rec_metrics for c in metric._metrics_computations]
    from rectrain.distributed.comm.timeouts import collective

    try:
        with collective("all_gather (metrics)", pg):
            for computation in computations:
                computation.sync(pg)
        values = {
            key.split("|")[1].removeprefix("local_"): float(v) for key, v in metrics.local_compute().items()
        }
        sums = tuple(
            float(getattr(ne, scope + name)) for name in ("weighted_num_samples", "pos_labels", "neg_labels")
        )
    finally:
        for computation in computations:
            if computation._is_synced:
                computation.unsync()
    return values, sums  # type: ignore[return-value]
