"""The metrics engine, with TorchRec's classes as its API: ``RecMetricComputation`` and ``RecMetric``.

A ``RecMetricComputation`` holds the states of one metric for ``n_tasks`` tasks and turns them into values:
each summed state has a lifetime copy (everything since ``reset``) and, with ``add_window_state``, a window
copy over the latest batches (a ``WindowBuffer`` of the per-batch contributions, at most ``window_size``
examples of this rank). ``compute`` combines the states of every rank first (``MetricStates.sync``), so a
value is over all ranks' examples, never an average of per-rank values; ``local_compute`` is this rank's.

A ``RecMetric`` feeds model outputs (a tensor, or a dict task name -> tensor) to its computations, one per
task or one for all tasks (``RecComputeMode``), and names the values ``f"{namespace}-{task}|{prefix}{name}"``.
The job's evaluation, the metrics log and progressive validation all compute through these classes.
"""

from __future__ import annotations

import abc
import itertools
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rectrain.metrics.metrics_config import RecComputeMode, RecTaskInfo
from rectrain.metrics.metrics_namespace import (
    MetricNameBase,
    MetricNamespaceBase,
    MetricPrefix,
    compose_metric_key,
)
from rectrain.metrics.state import MAX_BUFFER_COUNT, MetricStates, WindowBuffer

RecModelOutput = Tensor | dict[str, Tensor]

_FUSED_MODES = (RecComputeMode.FUSED_TASKS_COMPUTATION, RecComputeMode.FUSED_TASKS_AND_STATES_COMPUTATION)


@dataclass(frozen=True)
class MetricComputationReport:
    name: MetricNameBase
    metric_prefix: MetricPrefix
    value: Tensor
    description: str | None = None


class RecMetricException(Exception):
    pass


class RecMetricComputation(MetricStates, abc.ABC):
    """States and formulas of one metric for ``n_tasks`` tasks; ``update`` and ``_compute`` are the metric's.

    ``window_size`` is this rank's window in examples; ``compute_on_all_ranks=False`` returns values on rank
    0 only (the others still join the collective); ``should_validate_update`` skips all-zero-weight batches.
    """

    def __init__(
        self,
        my_rank: int,
        batch_size: int,
        n_tasks: int,
        window_size: int,
        compute_on_all_ranks: bool = False,
        should_validate_update: bool = False,
        compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION,
        process_group: dist.ProcessGroup | None = None,
        fused_update_limit: int = 0,
        allow_missing_label_with_zero_weight: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("enable_pt2_compile", None)  # PT2 compiles the caller; the states are plain tensors
        super().__init__(process_group=process_group)
        self._my_rank = my_rank
        self._n_tasks = n_tasks
        self._batch_size = batch_size
        self._window_size = window_size
        self._compute_on_all_ranks = compute_on_all_ranks
        self._should_validate_update = should_validate_update
        self._compute_mode = compute_mode
        self._batch_window_buffers: dict[str, WindowBuffer] | None = {} if window_size > 0 else None
        if should_validate_update:
            self._add_state(
                "has_valid_update",
                torch.zeros(n_tasks, dtype=torch.uint8),
                add_window_state=False,
                dist_reduce_fx=lambda x: torch.any(x, dim=0).byte(),
                persistent=True,
            )

    @staticmethod
    def get_window_state_name(state_name: str) -> str:
        return f"window_{state_name}"

    def get_window_state(self, state_name: str) -> Tensor:
        return getattr(self, self.get_window_state_name(state_name))

    def _add_state(self, name: str, default: Any, add_window_state: bool, **kwargs: Any) -> None:
        """A state ``name`` (``[n_tasks, ...]``); with ``add_window_state`` also ``window_<name>``."""
        self.add_state(name, default, **kwargs)
        if not add_window_state:
            return
        if self._batch_window_buffers is None:
            raise RuntimeError("Users is adding a window state while window metric is disabled.")
        kwargs["persistent"] = False
        window_name = self.get_window_state_name(name)
        self.add_state(window_name, default.detach().clone(), **kwargs)
        self._batch_window_buffers[window_name] = WindowBuffer(self._window_size, MAX_BUFFER_COUNT)

    def _aggregate_window_state(self, state_name: str, state: Tensor, num_samples: int) -> None:
        if self._batch_window_buffers is None:
            raise RuntimeError("Users is adding a window state while window metric is disabled.")
        window_name = self.get_window_state_name(state_name)
        self._batch_window_buffers[window_name].aggregate_state(
            getattr(self, window_name), state, num_samples
        )

    @abc.abstractmethod
    def update(
        self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any
    ) -> None: ...

    @abc.abstractmethod
    def _compute(self) -> list[MetricComputationReport]: ...

    def pre_compute(self) -> None:
        """Work on the local states before they are combined across ranks (none by default)."""

    def compute(self) -> list[MetricComputationReport]:
        """Values over every rank's states (a collective when distributed); [] off rank 0 unless
        ``compute_on_all_ranks``."""
        self.sync()
        try:
            if self._my_rank == 0 or self._compute_on_all_ranks:
                return self._compute()
            return []
        finally:
            if self._is_synced:
                self.unsync()

    def local_compute(self) -> list[MetricComputationReport]:
        return self._compute()

    def reset(self) -> None:
        super().reset()
        if self._batch_window_buffers is not None:
            self._batch_window_buffers = {
                name: WindowBuffer(self._window_size, MAX_BUFFER_COUNT) for name in self._batch_window_buffers
            }


class RecMetric(nn.Module, abc.ABC):
    """A metric of a model's tasks: routes outputs to its computations and names their values.

    Subclasses set ``_namespace`` and ``_computation_class``; ``window_size`` is the job's window in
    examples (each rank keeps ``ceil(window_size / world_size)``, which must be at least ``batch_size``).
    """

    _computation_class: type[RecMetricComputation]
    _namespace: MetricNamespaceBase

    PREDICTIONS: str = "predictions"
    LABELS: str = "labels"
    WEIGHTS: str = "weights"

    def __init__(
        self,
        world_size: int,
        my_rank: int,
        batch_size: int,
        tasks: list[RecTaskInfo],
        compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION,
        window_size: int = 100,
        fused_update_limit: int = 0,
        compute_on_all_ranks: bool = False,
        should_validate_update: bool = False,
        process_group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ) -> None:
        if compute_mode in _FUSED_MODES and fused_update_limit > 0:
            raise ValueError(
                "The fused tasks computation and the fused update cannot be set at the same time"
            )
        super().__init__()
        self._world_size = world_size
        self._my_rank = my_rank
        self._window_size = math.ceil(window_size / world_size)
        self._batch_size = batch_size
        self._tasks = tasks
        self._compute_mode = compute_mode
        self._fused_update_limit = fused_update_limit
        self._should_validate_update = should_validate_update
        self._should_clone_update_inputs = bool(kwargs.pop("should_clone_update_inputs", False))
        kwargs.pop("batch_size_stages", None)
        self._default_weights: dict[tuple[int, ...], Tensor] = {}
        self._required_inputs: set[str] = set()
        self._update_buffers: dict[str, list[RecModelOutput]] = {
            self.PREDICTIONS: [],
            self.LABELS: [],
            self.WEIGHTS: [],
        }
        if self._window_size < self._batch_size:
            raise ValueError(
                "Local window size must be larger than batch size. Got local window size "
                f"{self._window_size} and batch size {self._batch_size}."
            )
        fused = compute_mode in _FUSED_MODES
        self._metrics_computations = nn.ModuleList()
        for task_config in [tasks] if fused else tasks:
            self._metrics_computations.append(
                self._computation_class(
                    my_rank=my_rank,
                    batch_size=batch_size,
                    n_tasks=len(tasks) if fused else 1,
                    window_size=self._window_size,
                    compute_on_all_ranks=compute_on_all_ranks,
                    should_validate_update=should_validate_update,
                    compute_mode=compute_mode,
                    process_group=process_group,
                    fused_update_limit=fused_update_limit,
                    **{**kwargs, **self._get_task_kwargs(task_config)},
                )
            )
            self._required_inputs.update(self._get_task_required_inputs(task_config))

    def _get_task_kwargs(self, task_config: RecTaskInfo | list[RecTaskInfo]) -> dict[str, Any]:
        return {}

    def _get_task_required_inputs(self, task_config: RecTaskInfo | list[RecTaskInfo]) -> set[str]:
        return set()

    def _tasks_iter(self, scope: str) -> Iterator[tuple[RecTaskInfo, MetricComputationReport, Tensor]]:
        """(task, report, value) of every computation's ``{scope}compute()``; a task without a valid update
        (``should_validate_update``) reports zeros."""
        fused = self._compute_mode in _FUSED_MODES
        for i, computation in enumerate(self._metrics_computations):
            computation.pre_compute()
            valid = computation.has_valid_update if self._should_validate_update else itertools.repeat(1)
            for report in getattr(computation, scope + "compute")():
                tasks = self._tasks if fused else [self._tasks[i]]
                values = report.value if fused else [report.value]
                for task, value, ok in zip(tasks, values, valid):
                    yield task, report, value if ok > 0 else torch.zeros_like(value)

    def _keyed(self, scope: str) -> dict[str, Tensor]:
        self._check_fused_update(force=True)
        return {
            compose_metric_key(
                self._namespace,
                task.name,
                report.name,
                scope + report.metric_prefix.value,
                report.description,
            ): value
            for task, report, value in self._tasks_iter(scope)
        }

    def compute(self) -> dict[str, Tensor]:
        """Every value over all ranks (collective), keyed ``f"{namespace}-{task}|{prefix}{name}"``."""
        return self._keyed("")

    def local_compute(self) -> dict[str, Tensor]:
        """This rank's values, keyed with a ``local_`` prefix."""
        return self._keyed("local_")

    def update(
        self,
        *,
        predictions: RecModelOutput,
        labels: RecModelOutput,
        weights: RecModelOutput | None,
        **kwargs: Any,
    ) -> None:
        """Add a batch: a tensor ``[n_tasks, batch]`` (fused modes) or a dict task name -> ``[batch]``."""
        kwargs.pop("_log_tensors", None)
        if self._fused_update_limit <= 0:
            self._update(predictions=predictions, labels=labels, weights=weights, **kwargs)
            return
        self._update_buffers[self.PREDICTIONS].append(predictions)
        self._update_buffers[self.LABELS].append(labels)
        if weights is not None:
            self._update_buffers[self.WEIGHTS].append(weights)
        self._check_fused_update(force=False)

    def _check_fused_update(self, force: bool) -> None:
        """With ``fused_update_limit``, batches are buffered and added together every ``limit`` updates."""
        buffered = self._update_buffers[self.PREDICTIONS]
        if self._fused_update_limit <= 0 or not buffered:
            return
        if not force and len(buffered) < self._fused_update_limit:
            return
        fused = {key: _concat(outputs) for key, outputs in self._update_buffers.items() if outputs}
        for outputs in self._update_buffers.values():
            outputs.clear()
        self._update(
            predictions=fused[self.PREDICTIONS], labels=fused[self.LABELS], weights=fused.get(self.WEIGHTS)
        )

    def _create_default_weights(self, predictions: Tensor) -> Tensor:
        weights = self._default_weights.get(predictions.size())
        if weights is None:
            weights = self._default_weights[predictions.size()] = torch.ones_like(predictions)
        return weights

    def _check_nonempty_weights(self, weights: Tensor) -> Tensor:
        return torch.gt(torch.count_nonzero(weights, dim=-1), 0)

    @torch.no_grad()
    def _update(
        self,
        *,
        predictions: RecModelOutput,
        labels: RecModelOutput,
        weights: RecModelOutput | None,
        **kwargs: Any,
    ) -> None:
        if self._should_clone_update_inputs:
            predictions, labels = _clone(predictions), _clone(labels)
            weights = None if weights is None else _clone(weights)
        if self._compute_mode in _FUSED_MODES:
            self._update_fused(predictions, labels, weights, **kwargs)
        else:
            self._update_unfused(predictions, labels, weights, **kwargs)

    def _update_fused(
        self,
        predictions: RecModelOutput,
        labels: RecModelOutput,
        weights: RecModelOutput | None,
        **kwargs: Any,
    ) -> None:
        names = [task.name for task in self._tasks]
        stack = lambda o: o if isinstance(o, Tensor) else torch.stack([o[n] for n in names])  # noqa: E731
        predictions, labels = stack(predictions), stack(labels)
        n = len(self._tasks)
        if predictions.dim() == labels.dim():
            predictions = predictions.view(n, -1)
        else:  # multiclass: [batch, classes] per task
            predictions = predictions.view(n, -1, predictions.size(-1))
        labels = labels.view(n, -1)
        weights = self._create_default_weights(predictions) if weights is None else stack(weights).view(n, -1)
        computation = self._metrics_computations[0]
        if self._should_validate_update:
            valid = self._check_nonempty_weights(weights)
            if not torch.any(valid):
                return
            computation.has_valid_update.logical_or_(valid)
        computation.update(predictions=predictions, labels=labels, weights=weights, **kwargs)

    def _update_unfused(
        self,
        predictions: RecModelOutput,
        labels: RecModelOutput,
        weights: RecModelOutput | None,
        **kwargs: Any,
    ) -> None:
        required = kwargs.get("required_inputs")
        for task, computation in zip(self._tasks, self._metrics_computations):
            if task.name not in predictions:
                continue
            task_predictions, task_labels = predictions[task.name], labels[task.name]
            if task_predictions.numel() == 0:
                continue
            if task_predictions.dim() == task_labels.dim():
                task_predictions = task_predictions.view(1, -1)
            else:
                task_predictions = task_predictions.view(1, -1, task_predictions.size(-1))
            task_labels = task_labels.view(1, -1)
            if weights is None:
                task_weights = self._create_default_weights(task_predictions)
            else:
                task_weights = weights[task.name].view(1, -1)
            if self._should_validate_update:
                valid = self._check_nonempty_weights(task_weights)
                if not valid[0]:
                    continue
                computation.has_valid_update.logical_or_(valid)
            if required is not None:
                kwargs["required_inputs"] = {
                    k: v.view(task_labels.size()) if v.numel() > 1 else v.expand(task_labels.size())
                    for k, v in required.items()
                }
            computation.update(
                predictions=task_predictions, labels=task_labels, weights=task_weights, **kwargs
            )

    def sync(self) -> None:
        for computation in self._metrics_computations:
            computation.sync()

    def unsync(self) -> None:
        for computation in self._metrics_computations:
            if computation._is_synced:
                computation.unsync()

    def reset(self) -> None:
        for computation in self._metrics_computations:
            computation.reset()

    def get_memory_usage(self) -> dict[Tensor, int]:
        """Bytes of every tensor this metric holds (states, window buffers, cached default weights)."""
        sizes: dict[Tensor, int] = {}
        pending: deque[Any] = deque(self.__dict__.values())
        while pending:
            item = pending.popleft()
            if isinstance(item, Tensor):
                sizes[item] = item.numel() * item.element_size()
            elif isinstance(item, WindowBuffer):
                pending.extend(item.buffers)
            elif isinstance(item, Mapping):
                pending.extend(item.values())
            elif isinstance(item, Sequence) and not isinstance(item, str):
                pending.extend(item)
            elif hasattr(item, "__dict__") and not isinstance(item, (Enum, type)):
                pending.extend(item.__dict__.values())
        return sizes

    def state_dict(
        self, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> dict[str, Any]:
        self._check_fused_update(force=True)  # buffered batches are part of the state
        return super().state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def get_required_inputs(self) -> set[str]:
        return self._required_inputs


class RecMetricList(nn.Module):
    """Several ``RecMetric``s behind ``RecMetric``'s interface (update, compute, sync, reset)."""

    def __init__(self, rec_metrics: list[RecMetric]) -> None:
        super().__init__()
        self.rec_metrics = nn.ModuleList(rec_metrics)
        self.required_inputs = list(set().union(*[m.get_required_inputs() for m in rec_metrics])) or None

    def __len__(self) -> int:
        return len(self.rec_metrics)

    def __getitem__(self, idx: int) -> nn.Module:
        return self.rec_metrics[idx]

    def get_required_inputs(self) -> list[str] | None:
        return self.required_inputs

    def update(
        self,
        *,
        predictions: RecModelOutput,
        labels: RecModelOutput,
        weights: RecModelOutput | None,
        **kwargs: Any,
    ) -> None:
        for metric in self.rec_metrics:
            metric.update(predictions=predictions, labels=labels, weights=weights, **kwargs)

    def compute(self) -> dict[str, Tensor]:
        return {k: v for metric in self.rec_metrics for k, v in metric.compute().items()}

    def local_compute(self) -> dict[str, Tensor]:
        return {k: v for metric in self.rec_metrics for k, v in metric.local_compute().items()}

    def sync(self) -> None:
        for metric in self.rec_metrics:
            metric.sync()

    def unsync(self) -> None:
        for metric in self.rec_metrics:
            metric.unsync()

    def reset(self) -> None:
        for metric in self.rec_metrics:
            metric.reset()


def _concat(outputs: list[RecModelOutput]) -> RecModelOutput:
    if isinstance(outputs[0], Tensor):
        return torch.cat(outputs)
    return {name: torch.cat([o[name] for o in outputs]) for name in outputs[0]}


def _clone(output: RecModelOutput) -> RecModelOutput:
    return output.clone() if isinstance(output, Tensor) else {k: v.clone() for k, v in output.items()}
