"""``RecMetricModule`` and ``generate_metric_module`` (TorchRec's ``metrics.metric_module``).

The module a training loop talks to: ``update(model_out)`` after each forward (the model's output dict,
parsed per ``RecTaskInfo``), ``should_compute()`` every ``compute_interval_steps`` batches, then
``compute()`` (a collective: every rank calls it) for the values of every metric, the throughput and the
state metrics (an optimizer's, for example), keyed as TorchRec keys them.
"""

from __future__ import annotations

import abc
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rectrain.metrics.accuracy import AccuracyMetric
from rectrain.metrics.auc import AUCMetric
from rectrain.metrics.calibration import CalibrationMetric
from rectrain.metrics.ctr import CTRMetric
from rectrain.metrics.metrics_config import (
    BatchSizeStage,
    MetricsConfig,
    RecMetricEnum,
    RecMetricEnumBase,
    RecTaskInfo,
    StateMetricEnum,
    validate_batch_size_stages,
)
from rectrain.metrics.metrics_namespace import (
    MetricNamespace,
    compose_customized_metric_key,
    compose_metric_namespace,
)
from rectrain.metrics.model_utils import parse_task_model_outputs
from rectrain.metrics.mse import MSEMetric
from rectrain.metrics.ne import NEMetric
from rectrain.metrics.precision import PrecisionMetric
from rectrain.metrics.rec_metric import RecMetric, RecMetricException, RecMetricList
from rectrain.metrics.recall import RecallMetric
from rectrain.metrics.throughput import ThroughputMetric

__all__ = ["RecMetricException", "RecMetricModule", "StateMetric", "generate_metric_module"]

#: The metrics rectrain implements; TorchRec's other ``RecMetricEnum`` members are refused by name.
REC_METRICS_MAPPING: dict[RecMetricEnumBase, type[RecMetric]] = {
    RecMetricEnum.NE: NEMetric,
    RecMetricEnum.CTR: CTRMetric,
    RecMetricEnum.CALIBRATION: CalibrationMetric,
    RecMetricEnum.AUC: AUCMetric,
    RecMetricEnum.MSE: MSEMetric,
    RecMetricEnum.ACCURACY: AccuracyMetric,
    RecMetricEnum.PRECISION: PrecisionMetric,
    RecMetricEnum.RECALL: RecallMetric,
}

MODEL_METRIC_LABEL: str = "model"
MetricValue = Tensor | float
MetricsResult = dict[str, MetricValue]


class StateMetric(abc.ABC):
    """Metrics of a component's own state (an optimizer's, say), reported with the model's."""

    @abc.abstractmethod
    def get_metrics(self) -> MetricsResult: ...


class RecMetricModule(nn.Module):
    """Rec metrics, throughput and state metrics of a training job, updated per batch, computed together.

    ``min_compute_interval`` / ``max_compute_interval`` (seconds), when set, re-derive
    ``compute_interval_steps`` from the time between the first two ``compute()`` calls (the same on every
    rank).
    """

    def __init__(
        self,
        batch_size: int,
        world_size: int,
        rec_tasks: list[RecTaskInfo] | None = None,
        rec_metrics: RecMetricList | None = None,
        throughput_metric: ThroughputMetric | None = None,
        state_metrics: dict[str, StateMetric] | None = None,
        compute_interval_steps: int = 100,
        min_compute_interval: float = 0.0,
        max_compute_interval: float = float("inf"),
    ) -> None:
        super().__init__()
        self.rec_tasks = rec_tasks or []
        self.rec_metrics = rec_metrics if rec_metrics else RecMetricList([])
        self.throughput_metric = throughput_metric
        self.state_metrics = state_metrics or {}
        self.trained_batches = 0
        self.batch_size = batch_size
        self.world_size = world_size
        self.oom_count = 0
        self.compute_count = 0
        self.compute_interval_steps = compute_interval_steps
        self.min_compute_interval = min_compute_interval
        self.max_compute_interval = max_compute_interval
        if min_compute_interval == 0.0 and max_compute_interval == float("inf"):
            self.min_compute_interval = self.max_compute_interval = -1.0  # not adjusted
        elif max_compute_interval <= 0.0:
            raise ValueError("Max compute interval should not be smaller than 0.0.")
        elif min_compute_interval < 0.0:
            raise ValueError("Min compute interval should not be smaller than 0.0.")
        self.register_buffer("_compute_interval_steps", torch.zeros(1, dtype=torch.int32), persistent=False)
        self.last_compute_time = -1.0
        self._register_load_state_dict_pre_hook(self.load_state_dict_hook)

    def load_state_dict_hook(self, state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
        state_dict.pop(f"{prefix}_trained_batches", None)  # written by older TorchRec versions

    def _update_rec_metrics(self, model_out: dict[str, Tensor], **kwargs: Any) -> None:
        if self.rec_metrics and self.rec_tasks:
            labels, predictions, weights, required = parse_task_model_outputs(
                self.rec_tasks, model_out, self.get_required_inputs()
            )
            if required:
                kwargs["required_inputs"] = required
            self.rec_metrics.update(predictions=predictions, labels=labels, weights=weights, **kwargs)

    def update(self, model_out: dict[str, Tensor], **kwargs: Any) -> None:
        """One trained batch: ``model_out`` holds each task's label, prediction and weight tensors."""
        self._update_rec_metrics(model_out, **kwargs)
        if self.throughput_metric:
            self.throughput_metric.update()
        self.trained_batches += 1

    def _adjust_compute_interval(self) -> None:
        if self.last_compute_time > 0 and self.min_compute_interval >= 0:
            interval = time.time() - self.last_compute_time
            if not self.max_compute_interval >= interval >= self.min_compute_interval:
                per_step = interval / self.compute_interval_steps
                if self.max_compute_interval == float("inf"):
                    target = self.min_compute_interval + 1.0  # steps vary: aim above the minimum
                elif self.min_compute_interval == 0.0:
                    target = self.max_compute_interval - (0.0 if self.max_compute_interval <= 1.0 else 1.0)
                else:
                    target = (self.max_compute_interval + self.min_compute_interval) / 2
                self._compute_interval_steps[0] = int(target / per_step)
                dist.all_reduce(self._compute_interval_steps, op=dist.ReduceOp.MAX)
            self.compute_interval_steps = int(self._compute_interval_steps.item())
            self.min_compute_interval = self.max_compute_interval = -1.0
        self.last_compute_time = time.time()

    def should_compute(self) -> bool:
        return self.trained_batches % self.compute_interval_steps == 0

    def compute(self) -> MetricsResult:
        """Every metric over all ranks (a collective), throughput and state metrics."""
        self.compute_count += 1
        ret: MetricsResult = {}
        if self.rec_metrics:
            self._adjust_compute_interval()
            ret.update(self.rec_metrics.compute())
        if self.throughput_metric:
            ret.update(self.throughput_metric.compute())
        for namespace, component in self.state_metrics.items():
            for name, value in component.get_metrics().items():
                ret[compose_customized_metric_key(namespace, name)] = value
        return ret

    def local_compute(self) -> MetricsResult:
        """This rank's rec metrics (``local_`` keys)."""
        return dict(self.rec_metrics.local_compute()) if self.rec_metrics else {}

    def sync(self) -> None:
        self.rec_metrics.sync()

    def unsync(self) -> None:
        self.rec_metrics.unsync()

    def reset(self) -> None:
        self.rec_metrics.reset()

    def get_required_inputs(self) -> list[str] | None:
        return self.rec_metrics.get_required_inputs()


def _metric_tasks(config: MetricsConfig, metric: RecMetricEnumBase) -> list[RecTaskInfo]:
    definition = config.rec_metrics[metric]
    if definition.rec_tasks and definition.rec_task_indices:
        raise ValueError(
            f"rec_metrics[{metric}]: only one of RecMetricDef.rec_tasks and RecMetricDef.rec_task_indices "
            "should be specified."
        )
    if definition.rec_tasks:
        return definition.rec_tasks
    if definition.rec_task_indices:
        return [config.rec_tasks[i] for i in definition.rec_task_indices]
    raise ValueError(
        f"rec_metrics[{metric}]: one of RecMetricDef.rec_tasks and RecMetricDef.rec_task_indices "
        "should be a non-empty list"
    )


def _generate_rec_metrics(
    metrics_config: MetricsConfig,
    world_size: int,
    my_rank: int,
    batch_size: int,
    process_group: dist.ProcessGroup | None = None,
    batch_size_stages: list[BatchSizeStage] | None = None,
) -> RecMetricList:
    metrics = []
    for metric, definition in metrics_config.rec_metrics.items():
        if metric not in REC_METRICS_MAPPING:
            raise ValueError(
                f"rec_metrics: {metric} is not implemented in rectrain (it has "
                f"{', '.join(str(m) for m in REC_METRICS_MAPPING)})"
            )
        kwargs = dict(definition.arguments or {})
        kwargs["should_clone_update_inputs"] = metrics_config.should_clone_update_inputs
        kwargs["batch_size_stages"] = batch_size_stages
        metrics.append(
            REC_METRICS_MAPPING[metric](
                world_size=world_size,
                my_rank=my_rank,
                batch_size=batch_size,
                tasks=_metric_tasks(metrics_config, metric),
                compute_mode=metrics_config.rec_compute_mode,
                window_size=definition.window_size,
                fused_update_limit=metrics_config.fused_update_limit,
                compute_on_all_ranks=metrics_config.compute_on_all_ranks,
                should_validate_update=metrics_config.should_validate_update,
                process_group=process_group,
                **kwargs,
            )
        )
    return RecMetricList(metrics)


STATE_METRICS_NAMESPACE_MAPPING: dict[StateMetricEnum, MetricNamespace] = {
    StateMetricEnum.OPTIMIZERS: MetricNamespace.OPTIMIZERS,
    StateMetricEnum.MODEL_CONFIGURATOR: MetricNamespace.MODEL_CONFIGURATOR,
}


def _generate_state_metrics(
    metrics_config: MetricsConfig, state_metrics_mapping: dict[StateMetricEnum, StateMetric]
) -> dict[str, StateMetric]:
    state_metrics = {}
    for metric in metrics_config.state_metrics:
        namespace = STATE_METRICS_NAMESPACE_MAPPING.get(metric)
        if namespace is None:
            raise ValueError(f"Unknown StateMetrics {metric}")
        state_metrics[compose_metric_namespace(namespace, str(namespace))] = state_metrics_mapping[metric]
    return state_metrics


def generate_metric_module(
    metric_class: type[RecMetricModule],
    metrics_config: MetricsConfig,
    batch_size: int,
    world_size: int,
    my_rank: int,
    state_metrics_mapping: dict[StateMetricEnum, StateMetric],
    device: torch.device,
    process_group: dist.ProcessGroup | None = None,
    batch_size_stages: list[BatchSizeStage] | None = None,
    module_kwargs: dict[str, Any] | None = None,
) -> RecMetricModule:
    """The ``metric_class`` module that ``metrics_config`` describes, on ``device``."""
    rec_metrics = _generate_rec_metrics(
        metrics_config, world_size, my_rank, batch_size, process_group, batch_size_stages
    )
    validate_batch_size_stages(batch_size_stages)
    throughput = None
    if metrics_config.throughput_metric:
        throughput = ThroughputMetric(
            batch_size=batch_size,
            world_size=world_size,
            window_seconds=metrics_config.throughput_metric.window_size,
            warmup_steps=metrics_config.throughput_metric.warmup_steps,
            batch_size_stages=batch_size_stages,
        )
    module = metric_class(
        batch_size=batch_size,
        world_size=world_size,
        rec_tasks=metrics_config.rec_tasks,
        rec_metrics=rec_metrics,
        throughput_metric=throughput,
        state_metrics=_generate_state_metrics(metrics_config, state_metrics_mapping),
        compute_interval_steps=metrics_config.compute_interval_steps,
        min_compute_interval=metrics_config.min_compute_interval,
        max_compute_interval=metrics_config.max_compute_interval,
        **(module_kwargs or {}),
    )
    return module.to(device)
