"""Recall at a threshold, TorchRec's ``metrics.recall``: weighted true positives over actual positives.

(Retrieval recall@K of a two-tower model is ``rectrain.metrics.recall_at_k``, a different metric.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.summed import States, ThresholdedComputation

THRESHOLD = "threshold"


def compute_recall(num_true_positives: Tensor, num_false_negitives: Tensor) -> Tensor:
    total = num_true_positives + num_false_negitives
    return torch.where(total == 0.0, 0.0, num_true_positives / total)


def compute_true_pos_sum(
    labels: Tensor, predictions: Tensor, weights: Tensor, threshold: float = 0.5
) -> Tensor:
    return torch.sum(weights * ((predictions.double() >= threshold) * labels), dim=-1)


def compute_false_neg_sum(
    labels: Tensor, predictions: Tensor, weights: Tensor, threshold: float = 0.5
) -> Tensor:
    # TorchRec counts a prediction equal to the threshold as both a true positive and a false negative.
    return torch.sum(weights * ((predictions.double() <= threshold) * labels), dim=-1)


def get_recall_states(
    labels: Tensor, predictions: Tensor, weights: Tensor | None, threshold: float = 0.5
) -> dict[str, Tensor]:
    if weights is None:
        weights = torch.ones_like(predictions)
    return {
        "true_pos_sum": compute_true_pos_sum(labels, predictions, weights, threshold),
        "false_neg_sum": compute_false_neg_sum(labels, predictions, weights, threshold),
    }


class RecallMetricComputation(ThresholdedComputation):
    _state_names = ("true_pos_sum", "false_neg_sum")
    _get_states = staticmethod(get_recall_states)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        return [(MetricName.RECALL, compute_recall(s["true_pos_sum"], s["false_neg_sum"]))]


class RecallMetric(RecMetric):
    _namespace = MetricNamespace.RECALL
    _computation_class = RecallMetricComputation
