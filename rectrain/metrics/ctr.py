"""CTR, TorchRec's ``metrics.ctr``: the weighted rate of positive labels."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.summed import States, SummedStatesComputation

CTR_NUM = "ctr_num"
CTR_DENOM = "ctr_denom"


def compute_ctr(ctr_num: Tensor, ctr_denom: Tensor) -> Tensor:
    return torch.where(ctr_denom == 0.0, 0.0, ctr_num / ctr_denom).double()


def get_ctr_states(labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
    return {CTR_NUM: torch.sum(labels * weights, dim=-1), CTR_DENOM: torch.sum(weights, dim=-1)}


class CTRMetricComputation(SummedStatesComputation):
    _state_names = (CTR_NUM, CTR_DENOM)

    def _batch_states(self, labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
        return get_ctr_states(labels, predictions, weights)

    def _values(self, s: States) -> list[tuple[MetricName, Tensor]]:
        return [(MetricName.CTR, compute_ctr(s[CTR_NUM], s[CTR_DENOM]))]


class CTRMetric(RecMetric):
    _namespace = MetricNamespace.CTR
    _computation_class = CTRMetricComputation
