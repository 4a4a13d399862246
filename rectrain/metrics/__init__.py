"""Metrics with TorchRec's API (``torchrec.metrics`` -> ``rectrain.metrics``), one engine for all of them.

``rec_metric`` is the engine (``RecMetric``, ``RecMetricComputation``: lifetime and window states, tasks,
combination across ranks); ``auc``, ``ne``, ``calibration``, ``ctr``, ``mse``, ``accuracy``, ``precision``,
``recall`` are its metrics and ``metric_module`` the module a training loop drives. The job's evaluation
(``MetricsComputer``), progressive validation (``WindowedMetrics``) and the float helpers below (``auc``,
``normalized_entropy``, ...) are adapters over the same classes and formulas. ``recall_at_k`` is retrieval
recall of a two-tower model (not TorchRec's threshold ``RecallMetric``).
"""

from rectrain.metrics.computer import MetricsComputer
from rectrain.metrics.functional import (
    accuracy,
    auc,
    calibration,
    log_loss,
    normalized_entropy,
    recall_at_k,
    retrieval_scores,
)
from rectrain.metrics.window import WindowedMetrics

__all__ = [
    "MetricsComputer",
    "WindowedMetrics",
    "accuracy",
    "auc",
    "calibration",
    "log_loss",
    "normalized_entropy",
    "recall_at_k",
    "retrieval_scores",
]
