"""Random batches and the reference ``TestMetric`` of TorchRec's metric tests (``metrics.test_utils``)."""

from __future__ import annotations

import abc
import random

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.metrics.metrics_config import RecTaskInfo

TestRecMetricOutput = tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]


def gen_test_batch(
    batch_size: int,
    label_name: str = "label",
    prediction_name: str = "prediction",
    weight_name: str = "weight",
    tensor_name: str = "tensor",
    mask_tensor_name: str | None = None,
    label_value: Tensor | None = None,
    prediction_value: Tensor | None = None,
    weight_value: Tensor | None = None,
    mask: Tensor | None = None,
    n_classes: int | None = None,
    seed: int | None = None,
    device: str | torch.device | None = None,
) -> dict[str, Tensor]:
    """A random batch (labels in {0..n_classes-1}, predictions and weights uniform in [0, 1))."""
    device = torch.device(device or "cpu")
    if seed is not None:
        torch.manual_seed(seed)
    label = (
        label_value if label_value is not None else torch.randint(0, n_classes or 2, (batch_size,)).double()
    )
    if prediction_value is not None:
        prediction = prediction_value
    else:
        shape = (batch_size,) if n_classes is None else (batch_size, n_classes)
        prediction = torch.rand(shape, dtype=torch.double)
    weight = weight_value if weight_value is not None else torch.rand(batch_size, dtype=torch.double)
    batch = {
        label_name: label.to(device),
        prediction_name: prediction.to(device),
        weight_name: weight.to(device),
        tensor_name: torch.rand(batch_size, dtype=torch.double).to(device),
    }
    if mask_tensor_name is not None:
        batch[mask_tensor_name] = (
            mask if mask is not None else torch.ones(batch_size, dtype=torch.double).to(device)
        )
    return batch


def gen_test_tasks(task_names: list[str]) -> list[RecTaskInfo]:
    return [
        RecTaskInfo(
            name=name,
            label_name=f"{name}-label",
            prediction_name=f"{name}-prediction",
            weight_name=f"{name}-weight",
            tensor_name=f"{name}-tensor",
        )
        for name in task_names
    ]


def gen_test_timestamps(nsteps: int) -> list[float]:
    timestamps = [0.0]
    for _ in range(1, nsteps):
        timestamps.append(timestamps[-1] + random.uniform(1.0, 5.0))
    return timestamps


class TestMetric(abc.ABC):
    """A metric's reference: ``_get_states`` of a batch and ``_compute`` from (aggregated) states."""

    def __init__(
        self,
        world_size: int,
        rec_tasks: list[RecTaskInfo],
        compute_lifetime_metric: bool = True,
        compute_window_metric: bool = True,
        local_compute_lifetime_metric: bool = True,
        local_compute_window_metric: bool = True,
    ) -> None:
        self.world_size = world_size
        self._rec_tasks = rec_tasks
        self._enabled = (
            compute_lifetime_metric,
            compute_window_metric,
            local_compute_lifetime_metric,
            local_compute_window_metric,
        )

    @staticmethod
    def _aggregate(states: dict[str, Tensor], new_states: dict[str, Tensor]) -> None:
        for k, v in new_states.items():
            if k not in states:
                states[k] = torch.zeros_like(v)
            states[k] += v

    @staticmethod
    @abc.abstractmethod
    def _get_states(
        labels: Tensor, predictions: Tensor, weights: Tensor, required_inputs_tensor: Tensor | None = None
    ) -> dict[str, Tensor]: ...

    @staticmethod
    @abc.abstractmethod
    def _compute(states: dict[str, Tensor]) -> Tensor: ...

    def compute(
        self,
        model_outs: list[dict[str, Tensor]],
        nsteps: int,
        batch_window_size: int,
        timestamps: list[float] | None,
    ) -> TestRecMetricOutput:
        """(lifetime, window, local lifetime, local window) values per task; global ones over all ranks'
        batches (all-gathered), window ones over the last ``batch_window_size`` steps."""
        states = [{task.name: {} for task in self._rec_tasks} for _ in range(4)]
        for i in range(nsteps):
            gathered = {}
            for k, v in model_outs[i].items():
                parts = [torch.zeros_like(v) for _ in range(self.world_size)]
                dist.all_gather(parts, v)
                gathered[k] = torch.cat(parts)
            in_window = nsteps - batch_window_size <= i
            for task in self._rec_tasks:
                for j, out in enumerate((gathered, model_outs[i])):
                    batch_states = self._get_states(
                        out[task.label_name],
                        out[task.prediction_name],
                        out[task.weight_name],
                        out[task.tensor_name or "tensor"],
                    )
                    for kind, window in ((2 * j, False), (2 * j + 1, True)):
                        if self._enabled[kind] and (in_window or not window):
                            self._aggregate(states[kind][task.name], batch_states)
        return tuple(  # type: ignore[return-value]
            {
                task.name: self._compute(states[kind][task.name])
                if self._enabled[kind]
                else torch.tensor(0.0)
                for task in self._rec_tasks
            }
            for kind in range(4)
        )
