"""Training and evaluation metrics: AUC, NE, log loss, accuracy, calibration, recall@K, across ranks."""

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
