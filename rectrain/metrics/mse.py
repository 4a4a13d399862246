"""MSE, RMSE and R squared, TorchRec's ``metrics.mse`` (for regression tasks)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.summed import States, SummedStatesComputation

ERROR_SUM = "error_sum"
WEIGHTED_NUM_SAMPLES = "weighted_num_samples"
LABEL_SUM = "label_sum"
LABEL_SQUARED_SUM = "label_squared_sum"


def compute_mse(error_sum: Tensor, weighted_num_samples: Tensor) -> Tensor:
    return torch.where(weighted_num_samples == 0.0, 0.0, error_sum / weighted_num_samples).double()


def compute_rmse(error_sum: Tensor, weighted_num_samples: Tensor) -> Tensor:
    return torch.where(
        weighted_num_samples == 0.0, 0.0, torch.sqrt(error_sum / weighted_num_samples)
    ).double()


def compute_r_squared(
    error_sum: Tensor, weighted_num_samples: Tensor, label_sum: Tensor, label_squared_sum: Tensor
) -> Tensor:
    """1 - residual sum of squares / total sum of squares (1.0 when the labels do not vary)."""
    total = label_squared_sum.double() - torch.square(label_sum.double()) / weighted_num_samples.double()
    return torch.where(total == 0.0, 1.0, 1.0 - error_sum / total).double()


def compute_error_sum(labels: Tensor, predictions: Tensor, weights: Tensor) -> Tensor:
    return torch.sum(weights * torch.square(labels - predictions.double()), dim=-1)


def get_mse_states(labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
    return {
        ERROR_SUM: compute_error_sum(labels, predictions, weights),
        WEIGHTED_NUM_SAMPLES: torch.sum(weights, dim=-1),
        LABEL_SUM: torch.sum(weights * labels, dim=-1),
        LABEL_SQUARED_SUM: torch.sum(weights * torch.square(labels), dim=-1),
    }


class MSEMetricComputation(SummedStatesComputation):
    """MSE and RMSE, and with ``include_r_squared`` R squared (whose label sums are then checkpointed)."""

    _state_names = (ERROR_SUM, WEIGHTED_NUM_SAMPLES, LABEL_SUM, LABEL_SQUARED_SUM)

    def __init__(self, *args: Any, include_r_squared: bool = False, **kwargs: Any) -> None:
        self._include_r_squared = include_r_squared
        super().__init__(*args, **kwargs)

    def _persistent_state(self, name: str) -> bool:
        return name in (ERROR_SUM, WEIGHTED_NUM_SAMPLES) or self._include_r_squared

    def _batch_states(self, labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
        return get_mse_states(labels, predictions, weights)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        values = [
            (MetricName.MSE, compute_mse(s[ERROR_SUM], s[WEIGHTED_NUM_SAMPLES])),
            (MetricName.RMSE, compute_rmse(s[ERROR_SUM], s[WEIGHTED_NUM_SAMPLES])),
        ]
        if self._include_r_squared:
            r_squared = compute_r_squared(
                s[ERROR_SUM], s[WEIGHTED_NUM_SAMPLES], s[LABEL_SUM], s[LABEL_SQUARED_SUM]
            )
            values.append((MetricName.R_SQUARED, r_squared))
        return values


class MSEMetric(RecMetric):
    _namespace = MetricNamespace.MSE
    _computation_class = MSEMetricComputation
