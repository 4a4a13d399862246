"""Precision at a threshold, TorchRec's ``metrics.precision``: weighted true over predicted positives."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.recall import compute_true_pos_sum
from rectrain.metrics.summed import States, ThresholdedComputation

THRESHOLD = "threshold"


def compute_precision(num_true_positives: Tensor, num_false_positives: Tensor) -> Tensor:
    total = num_true_positives + num_false_positives
    return torch.where(total == 0.0, 0.0, num_true_positives / total.double())


def compute_false_pos_sum(
    labels: Tensor, predictions: Tensor, weights: Tensor, threshold: float = 0.5
) -> Tensor:
    return torch.sum(weights * ((predictions.double() >= threshold) * (1 - labels)), dim=-1)


def get_precision_states(
    labels: Tensor, predictions: Tensor, weights: Tensor | None, threshold: float = 0.5
) -> dict[str, Tensor]:
    if weights is None:
        weights = torch.ones_like(predictions)
    return {
        "true_pos_sum": compute_true_pos_sum(labels, predictions, weights, threshold),
        "false_pos_sum": compute_false_pos_sum(labels, predictions, weights, threshold),
    }


class PrecisionMetricComputation(ThresholdedComputation):
    _state_names = ("true_pos_sum", "false_pos_sum")
    _get_states = staticmethod(get_precision_states)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        return [(MetricName.PRECISION, compute_precision(s["true_pos_sum"], s["false_pos_sum"]))]


class PrecisionMetric(RecMetric):
    _namespace = MetricNamespace.PRECISION
    _computation_class = PrecisionMetricComputation
