"""Calibration, TorchRec's ``metrics.calibration``: weighted sum of predictions over that of labels."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.summed import States, SummedStatesComputation

CALIBRATION_NUM = "calibration_num"
CALIBRATION_DENOM = "calibration_denom"


def compute_calibration(calibration_num: Tensor, calibration_denom: Tensor) -> Tensor:
    """1.0 when the model predicts the label rate on average; 0 without positive labels (TorchRec's)."""
    return torch.where(calibration_denom <= 0.0, 0.0, calibration_num / calibration_denom).double()


def get_calibration_states(labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
    return {
        CALIBRATION_NUM: torch.sum(predictions * weights, dim=-1),
        CALIBRATION_DENOM: torch.sum(labels * weights, dim=-1),
    }


class CalibrationMetricComputation(SummedStatesComputation):
    _state_names = (CALIBRATION_NUM, CALIBRATION_DENOM)

    def _batch_states(self, labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
        return get_calibration_states(labels, predictions, weights)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        return [(MetricName.CALIBRATION, compute_calibration(s[CALIBRATION_NUM], s[CALIBRATION_DENOM]))]


class CalibrationMetric(RecMetric):
    _namespace = MetricNamespace.CALIBRATION
    _computation_class = CalibrationMetricComputation
