"""NE (normalised entropy) and log loss, TorchRec's ``metrics.ne``: the formulas of every NE in rectrain.

Cross entropy is in bits (``log2``) with predictions clamped to ``[eta, 1 - eta]``; NE divides it by the
entropy of the label rate, so it is independent of the base (``rectrain.metrics.log_loss`` reports nats).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.summed import States, SummedStatesComputation

#: TorchRec's clamp: a confident mistake costs log2(1e12) ~ 40 bits instead of infinity.
ETA = 1e-12


def compute_cross_entropy(labels: Tensor, predictions: Tensor, weights: Tensor, eta: float) -> Tensor:
    """Weighted per-example binary cross entropy in bits."""
    predictions = predictions.double().clamp(min=eta, max=1 - eta)
    return -weights * labels * torch.log2(predictions) - weights * (1.0 - labels) * torch.log2(
        1.0 - predictions
    )


def _compute_cross_entropy_norm(
    mean_label: Tensor, pos_labels: Tensor, neg_labels: Tensor, eta: float
) -> Tensor:
    mean_label = mean_label.double().clamp(min=eta, max=1 - eta)
    return -pos_labels * torch.log2(mean_label) - neg_labels * torch.log2(1.0 - mean_label)


@torch.fx.wrap
def compute_ne(
    ce_sum: Tensor,
    weighted_num_samples: Tensor,
    pos_labels: Tensor,
    neg_labels: Tensor,
    eta: float,
    allow_missing_label_with_zero_weight: bool = False,
) -> Tensor:
    """Summed cross entropy over the cross entropy of always predicting the (weighted) label rate."""
    mean_label = pos_labels / weighted_num_samples.double().clamp(min=eta)
    ne = ce_sum / _compute_cross_entropy_norm(mean_label, pos_labels, neg_labels, eta)
    if allow_missing_label_with_zero_weight and not weighted_num_samples.all():
        return torch.where(weighted_num_samples > 0, ne, eta)
    return ne


def compute_logloss(ce_sum: Tensor, pos_labels: Tensor, neg_labels: Tensor, eta: float) -> Tensor:
    """Mean cross entropy in bits per unit of weight."""
    return ce_sum / (pos_labels + neg_labels).clamp(min=eta)


def get_ne_states(labels: Tensor, predictions: Tensor, weights: Tensor, eta: float) -> dict[str, Tensor]:
    return {
        "cross_entropy_sum": torch.sum(compute_cross_entropy(labels, predictions, weights, eta), dim=-1),
        "weighted_num_samples": torch.sum(weights, dim=-1),
        "pos_labels": torch.sum(weights * labels, dim=-1),
        "neg_labels": torch.sum(weights * (1.0 - labels), dim=-1),
    }


class NEMetricComputation(SummedStatesComputation):
    """NE, and with ``include_logloss`` the log loss, lifetime and window."""

    _state_names = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")

    def __init__(
        self,
        *args: Any,
        include_logloss: bool = False,
        allow_missing_label_with_zero_weight: bool = False,
        **kwargs: Any,
    ) -> None:
        self._include_logloss = include_logloss
        self._allow_missing_label_with_zero_weight = allow_missing_label_with_zero_weight
        super().__init__(*args, **kwargs)
        self.eta = ETA

    def _batch_states(self, labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
        return get_ne_states(labels, predictions, weights, self.eta)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        ce, n, pos, neg = (s[name] for name in self._state_names)
        values = [
            (MetricName.NE, compute_ne(ce, n, pos, neg, self.eta, self._allow_missing_label_with_zero_weight))
        ]
        if self._include_logloss:
            values.append((MetricName.LOG_LOSS, compute_logloss(ce, pos, neg, self.eta)))
        return values


class NEMetric(RecMetric):
    _namespace = MetricNamespace.NE
    _computation_class = NEMetricComputation
