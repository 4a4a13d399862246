"""``WindowedMetrics``: AUC and NE over the job's latest examples (progressive validation), windowed
``AUCMetric`` and ``NEMetric``.

Each rank keeps its share (``window / world_size``) on the device its predictions are on: ``update`` only
appends and trims (no host sync, so it runs at every training step on a GPU). ``compute`` is a collective
that combines the ranks' windows. As TorchRec's, AUC's window is the latest examples exactly and NE's the
latest whole batches that fit in it (``num_examples`` counts those), so with batches that divide the window
both cover the same examples. Undefined values (one class, nothing seen) are NaN, as in ``MetricsComputer``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.metrics.auc import AUCMetric
from rectrain.metrics.computer import LN2, synced_values, update_binary
from rectrain.metrics.metrics_config import DefaultTaskInfo
from rectrain.metrics.ne import NEMetric
from rectrain.metrics.rec_metric import RecMetricList


class WindowedMetrics:
    """AUC and NE over the latest ``window`` examples of the job (``window / world_size`` per rank)."""

    def __init__(self, window: int, world_size: int = 1, batch_size: int = 1) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        common = dict(
            world_size=world_size,
            my_rank=0,
            batch_size=batch_size,
            tasks=[DefaultTaskInfo],
            window_size=window,
            compute_on_all_ranks=True,
        )
        self._metrics = RecMetricList(
            [AUCMetric(no_signal_value=math.nan, **common), NEMetric(include_logloss=True, **common)]
        )

    @torch.no_grad()
    def update(self, predictions: Tensor, labels: Tensor) -> None:
        """Add a batch: ``predictions`` are probabilities in [0, 1], ``labels`` 0/1, same shape."""
        update_binary(self._metrics, predictions, labels)

    @torch.no_grad()
    def compute(self, pg: dist.ProcessGroup | None = None) -> dict[str, float]:
        """``auc``, ``ne``, ``log_loss`` and ``num_examples`` over every rank's window (collective when
        ``torch.distributed`` is initialised)."""
        ne = self._metrics[1]._metrics_computations[0]
        values, (count, pos, neg) = synced_values(self._metrics, ne, "window_", pg)
        return {
            "auc": values["window_auc"],
            "ne": values["window_ne"] if pos > 0 and neg > 0 else math.nan,
            "log_loss": values["window_logloss"] * LN2 if count else math.nan,
            "num_examples": round(count),
        }
