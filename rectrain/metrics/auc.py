"""AUC, TorchRec's ``metrics.auc``: ROC AUC over each rank's latest ``window_size`` examples, all ranks.

The one AUC of rectrain (evaluation, progressive validation and ``rectrain.metrics.auc`` compute here).
It is the weighted Mann-Whitney statistic: the weighted share of (positive, negative) pairs in which the
positive scores higher, a tie counting one half. TorchRec integrates the ROC curve point by point after a
sort, so tied scores count in whatever order the sort left them; without ties the two agree. With only one
class in the window AUC is undefined: TorchRec reports 0.5 (``no_signal_value``, which rectrain's own
reports set to NaN).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from rectrain.metrics.rec_metric import (
    MetricComputationReport,
    RecMetric,
    RecMetricComputation,
    RecMetricException,
)

logger = logging.getLogger(__name__)

PREDICTIONS = "predictions"
LABELS = "labels"
WEIGHTS = "weights"
GROUPING_KEYS = "grouping_keys"
REQUIRED_INPUTS = "required_inputs"


def _compute_auc_helper(
    predictions: Tensor,
    labels: Tensor,
    weights: Tensor,
    apply_bin: bool = False,
    no_signal_value: float = 0.5,
) -> Tensor:
    """AUC of one task's 1-D scores; ``no_signal_value`` when a class has no weight."""
    if apply_bin:  # soft labels: >= 0.039 is a positive (TorchRec's cut)
        labels = torch.ge(labels, 0.039).to(labels.dtype)
    scores, order = torch.sort(predictions)
    labels, weights = labels[order].double(), weights[order].double()
    _, counts = torch.unique_consecutive(scores, return_counts=True)
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=scores.device), counts)
    pos = torch.zeros(counts.numel(), dtype=torch.double, device=scores.device).index_add_(
        0, group, weights * labels
    )
    neg = torch.zeros_like(pos).index_add_(0, group, weights * (1.0 - labels))
    neg_below = torch.cumsum(neg, 0) - neg
    pairs = pos.sum() * neg.sum()
    wins = (pos * (neg_below + 0.5 * neg)).sum()
    auc = torch.where(pairs == 0, no_signal_value, wins / pairs.clamp(min=torch.finfo(torch.double).tiny))
    return auc.to(predictions.dtype if predictions.is_floating_point() else torch.float)


def _concat_if_needed(
    predictions: list[Tensor], labels: list[Tensor], weights: list[Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.cat(predictions, dim=-1), torch.cat(labels, dim=-1), torch.cat(weights, dim=-1)


def compute_auc(
    n_tasks: int,
    predictions: list[Tensor],
    labels: list[Tensor],
    weights: list[Tensor],
    apply_bin: bool = False,
    no_signal_value: float = 0.5,
) -> Tensor:
    """AUC per task of ``[n_tasks, n]`` buffers (lists of them, concatenated along examples)."""
    preds, labs, wts = _concat_if_needed(predictions, labels, weights)
    return torch.cat(
        [
            _compute_auc_helper(p, y, w, apply_bin, no_signal_value).view(1)
            for p, y, w in zip(preds, labs, wts)
        ]
    )


def compute_auc_per_group(
    n_tasks: int,
    predictions: list[Tensor],
    labels: list[Tensor],
    weights: list[Tensor],
    grouping_keys: Tensor,
) -> Tensor:
    """Per task, the mean over groups (``grouping_keys[n]``) of each group's AUC."""
    preds, labs, wts = _concat_if_needed(predictions, labels, weights)
    if grouping_keys.numel() and grouping_keys[0] == -1:  # the initial padding of the state
        grouping_keys = grouping_keys[1:]
    groups = torch.unique(grouping_keys)
    aucs = []
    for p, y, w in zip(preds, labs, wts):
        per_group = [
            _compute_auc_helper(p[keys], y[keys], w[keys]) for keys in (grouping_keys == g for g in groups)
        ]
        aucs.append(torch.stack(per_group).mean().view(1) if per_group else torch.tensor([0.5]))
    return torch.cat(aucs)


def _state_reduction(state: list[Tensor], dim: int = 1) -> list[Tensor]:
    return [torch.cat(state, dim=dim)]


_grouping_keys_state_reduction = partial(_state_reduction, dim=0)


class AUCMetricComputation(RecMetricComputation):
    """The latest ``window_size`` (prediction, label, weight) of each task, ``[n_tasks, n]`` float32.

    Args: ``grouped_auc`` also reports the mean per-group AUC (``required_inputs["grouping_keys"]``),
    ``apply_bin`` binarises soft labels, ``no_signal_value`` is the AUC of a window without both classes.
    """

    def __init__(
        self,
        *args: Any,
        grouped_auc: bool = False,
        apply_bin: bool = False,
        fused_update_limit: int = 0,
        no_signal_value: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if grouped_auc and fused_update_limit > 0:
            raise RecMetricException("Grouped AUC and Fused Update Limit cannot be enabled together yet.")
        self._grouped_auc = grouped_auc
        self._apply_bin = apply_bin
        self._no_signal_value = no_signal_value
        self._num_samples = 0
        for name in (PREDICTIONS, LABELS, WEIGHTS):
            self._add_state(
                name, [], add_window_state=False, dist_reduce_fx=_state_reduction, persistent=False
            )
        if grouped_auc:
            self._add_state(
                GROUPING_KEYS, [], add_window_state=False, dist_reduce_fx=_grouping_keys_state_reduction
            )
        self._init_states()

    def _init_states(self) -> None:
        """One zero-weight example per state, so that a rank without updates still has tensors to gather."""
        if len(getattr(self, PREDICTIONS)) > 0:
            return
        self._num_samples = 0
        for name in (PREDICTIONS, LABELS, WEIGHTS):
            getattr(self, name).append(torch.zeros((self._n_tasks, 1), dtype=torch.float, device=self.device))
        if self._grouped_auc:
            getattr(self, GROUPING_KEYS).append(torch.tensor([-1], device=self.device))

    # The buffers are a Python list that grows and is trimmed per batch: traced, every length would be a
    # recompile, so torch.compile runs this eagerly.
    @torch.compiler.disable
    def update(
        self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any
    ) -> None:
        if predictions is None or weights is None:
            raise RecMetricException(
                "Inputs 'predictions' and 'weights' should not be None for AUCMetricComputation update"
            )
        batch_size = predictions.size(-1)
        start_index = max(self._num_samples + batch_size - self._window_size, 0)
        buffers = [getattr(self, name) for name in (PREDICTIONS, LABELS, WEIGHTS)]
        if self._num_samples == 0:  # drop the initial padding
            for buffer in buffers:
                buffer.pop(0)
        for buffer, value in zip(buffers, (predictions, labels, weights)):
            buffer.append(value.float())
        self._num_samples += batch_size
        self._trim(buffers)
        if self._grouped_auc:
            keys = kwargs.get(REQUIRED_INPUTS, {}).get(GROUPING_KEYS)
            if keys is None:
                raise RecMetricException(
                    f"Input '{GROUPING_KEYS}' are required for AUCMetricComputation grouped update"
                )
            state = getattr(self, GROUPING_KEYS)
            state[0] = torch.cat([state[0][start_index:], keys.squeeze()], dim=0)

    def _trim(self, buffers: list[list[Tensor]]) -> None:
        """Drop the oldest examples beyond the window (whole tensors, then a slice of the oldest one)."""
        while self._num_samples > self._window_size:
            excess = self._num_samples - self._window_size
            oldest = buffers[0][0].size(-1)
            if excess >= oldest:
                for buffer in buffers:
                    buffer.pop(0)
                self._num_samples -= oldest
            else:
                for buffer in buffers:
                    buffer[0] = buffer[0][:, excess:]
                self._num_samples -= excess

    def _compute(self) -> list[MetricComputationReport]:
        buffers = [getattr(self, name) for name in (PREDICTIONS, LABELS, WEIGHTS)]
        reports = [
            MetricComputationReport(
                MetricName.AUC,
                MetricPrefix.WINDOW,
                compute_auc(self._n_tasks, *buffers, self._apply_bin, self._no_signal_value),
            )
        ]
        if self._grouped_auc:
            keys = getattr(self, GROUPING_KEYS)[0]
            value = compute_auc_per_group(self._n_tasks, *buffers, keys)
            reports.append(MetricComputationReport(MetricName.GROUPED_AUC, MetricPrefix.WINDOW, value))
        return reports

    def reset(self) -> None:
        super().reset()
        self._init_states()


class AUCMetric(RecMetric):
    _namespace = MetricNamespace.AUC
    _computation_class = AUCMetricComputation

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # RecMetric's arguments
        super().__init__(*args, **kwargs)
        if kwargs.get("grouped_auc"):
            self._required_inputs.add(GROUPING_KEYS)
