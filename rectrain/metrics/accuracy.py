"""Accuracy, TorchRec's ``metrics.accuracy``: the weighted share of ``(prediction >= threshold) == label``."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.summed import States, ThresholdedComputation

THRESHOLD = "threshold"


def compute_accuracy(accuracy_sum: Tensor, weighted_num_samples: Tensor) -> Tensor:
    return torch.where(weighted_num_samples == 0.0, 0.0, accuracy_sum / weighted_num_samples).double()


def compute_accuracy_sum(
    labels: Tensor, predictions: Tensor, weights: Tensor, threshold: float = 0.5
) -> Tensor:
    return torch.sum(weights * ((predictions.double() >= threshold) == labels), dim=-1)


def get_accuracy_states(
    labels: Tensor, predictions: Tensor, weights: Tensor | None, threshold: float = 0.5
) -> dict[str, Tensor]:
    if weights is None:
        weights = torch.ones_like(predictions)
    return {
        "accuracy_sum": compute_accuracy_sum(labels, predictions, weights, threshold),
        "weighted_num_samples": torch.sum(weights, dim=-1),
    }


class AccuracyMetricComputation(ThresholdedComputation):
    _state_names = ("accuracy_sum", "weighted_num_samples")
    _get_states = staticmethod(get_accuracy_states)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        return [(MetricName.ACCURACY, compute_accuracy(s["accuracy_sum"], s["weighted_num_samples"]))]


class AccuracyMetric(RecMetric):
    _namespace = MetricNamespace.ACCURACY
    _computation_class = AccuracyMetricComputation
