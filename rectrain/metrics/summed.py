"""``SummedStatesComputation``: a metric whose states are per-task sums over examples (NE, CTR, MSE, ...).

Most of TorchRec's metrics share one shape: each batch contributes a few weighted sums per task, every sum
has a lifetime and a window copy, and the values are formulas of the sums. A metric names its sums, says how
a batch contributes (``_batch_states``) and how values follow from sums (``_values``); updating, windowing
and reporting are written once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from rectrain.metrics.metrics_namespace import MetricNameBase, MetricPrefix
from rectrain.metrics.rec_metric import MetricComputationReport, RecMetricComputation, RecMetricException

States = Mapping[str, Tensor]


class SummedStatesComputation(RecMetricComputation):
    """Per-task float64 sums named by ``_state_names``, each with a window copy."""

    _state_names: tuple[str, ...]
    #: Whether ``update`` needs weights (RecMetric always passes them; direct callers may not).
    _needs_weights: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self._state_names:
            self._add_state(
                name,
                torch.zeros(self._n_tasks, dtype=torch.double),
                add_window_state=True,
                dist_reduce_fx="sum",
                persistent=self._persistent_state(name),
            )

    def _persistent_state(self, name: str) -> bool:
        return True

    def _batch_states(self, labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
        """This batch's contribution to each sum, ``[n_tasks]``."""
        raise NotImplementedError

    def _values(self, states: States) -> list[tuple[MetricNameBase, Tensor]]:
        """The metric's values from the sums (lifetime or window)."""
        raise NotImplementedError

    def update(
        self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any
    ) -> None:
        if predictions is None or (weights is None and self._needs_weights):
            needed = "'predictions' and 'weights'" if self._needs_weights else "'predictions'"
            raise RecMetricException(f"Inputs {needed} should not be None for {type(self).__name__} update")
        if weights is None:
            weights = torch.ones_like(predictions)
        num_samples = predictions.shape[-1]
        for name, value in self._batch_states(labels, predictions, weights).items():
            state = getattr(self, name)
            state += value
            self._aggregate_window_state(name, value, num_samples)

    def _compute(self) -> list[MetricComputationReport]:
        scopes: list[tuple[MetricPrefix, Callable[[str], Tensor]]] = [
            (MetricPrefix.LIFETIME, lambda name: getattr(self, name)),
            (MetricPrefix.WINDOW, self.get_window_state),
        ]
        reports = []
        for prefix, state in scopes:
            states = {name: state(name) for name in self._state_names}
            reports += [MetricComputationReport(name, prefix, value) for name, value in self._values(states)]
        return reports


class ThresholdedComputation(SummedStatesComputation):
    """Sums of a batch classified at ``threshold`` (accuracy, precision, recall): ``_get_states`` gives
    them from ``(labels, predictions, weights, threshold)``; weights are optional."""

    _needs_weights = False
    _get_states: Callable[[Tensor, Tensor, Tensor | None, float], dict[str, Tensor]]

    def __init__(self, *args: Any, threshold: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._threshold = threshold

    def _batch_states(self, labels: Tensor, predictions: Tensor, weights: Tensor) -> dict[str, Tensor]:
        return type(self)._get_states(labels, predictions, weights, self._threshold)
