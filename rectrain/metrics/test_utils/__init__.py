"""TorchRec's metric test harness (``torchrec.metrics.test_utils``), so its metric tests run unchanged.

A test gives a metric class and a reference ``TestMetric`` (states of a batch, value from states); the
helpers feed both the same random batches on every rank (``torch.distributed.launcher`` with gloo) and
compare lifetime, window, local lifetime and local window values. The reference all-gathers the batches
and recomputes from scratch, so it checks the engine's windows and cross-rank combination independently.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from typing import Any
from unittest.mock import Mock, patch

import torch
import torch.distributed as dist
import torch.distributed.launcher as pet
from torch import Tensor

from rectrain.metrics.metrics_config import RecComputeMode, RecTaskInfo
from rectrain.metrics.model_utils import parse_task_model_outputs
from rectrain.metrics.rec_metric import RecMetric
from rectrain.metrics.test_utils.reference import (
    TestMetric,
    TestRecMetricOutput,
    gen_test_batch,
    gen_test_tasks,
    gen_test_timestamps,
)

__all__ = [
    "BATCH_SIZE",
    "BATCH_WINDOW_SIZE",
    "NSTEPS",
    "TestMetric",
    "TestRecMetricOutput",
    "gen_test_batch",
    "gen_test_tasks",
    "gen_test_timestamps",
    "metric_test_helper",
    "rec_metric_accuracy_test_helper",
    "rec_metric_gpu_sync_test_launcher",
    "rec_metric_value_test_helper",
    "rec_metric_value_test_launcher",
    "sync_test_helper",
]

BATCH_SIZE = 32
BATCH_WINDOW_SIZE = 5
NSTEPS = 10

#: Metrics with window values only (TorchRec keeps no lifetime AUC: its buffers would grow without bound).
_WINDOW_ONLY_NAMESPACES = {"auc", "auprc", "rauc"}


def _tasks_batch(
    tasks: list[RecTaskInfo], batch_size: int, n_classes: int | None, device: torch.device, **kwargs: Any
) -> dict[str, Tensor]:
    """One random batch with every task's label, prediction and weight (``gen_test_batch``'s ``kwargs``)."""
    batch: dict[str, Tensor] = {}
    for task in tasks:
        batch.update(
            gen_test_batch(
                label_name=task.label_name,
                prediction_name=task.prediction_name,
                weight_name=task.weight_name,
                tensor_name=task.tensor_name or "tensor",
                batch_size=batch_size,
                n_classes=n_classes,
                device=device,
                **kwargs,
            )
        )
    return batch


def rec_metric_value_test_helper(
    target_clazz: type[RecMetric],
    target_compute_mode: RecComputeMode,
    test_clazz: type[TestMetric] | None,
    fused_update_limit: int,
    compute_on_all_ranks: bool,
    should_validate_update: bool,
    world_size: int,
    my_rank: int,
    task_names: list[str],
    batch_size: int = BATCH_SIZE,
    nsteps: int = NSTEPS,
    batch_window_size: int = BATCH_WINDOW_SIZE,
    is_time_dependent: bool = False,
    time_dependent_metric: dict[type[RecMetric], str] | None = None,
    n_classes: int | None = None,
    zero_weights: bool = False,
    zero_labels: bool = False,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> tuple[dict[str, Tensor], TestRecMetricOutput]:
    """The target metric's values (global and local) and the reference's, on ``nsteps`` random batches."""
    device = torch.device(device or "cpu")
    tasks = gen_test_tasks(task_names)
    weight_value = torch.zeros(batch_size) if zero_weights else None
    label_value = torch.zeros(batch_size) if zero_labels else None
    model_outs = []
    for _ in range(nsteps):
        batch = _tasks_batch(
            tasks, batch_size, n_classes, device, weight_value=weight_value, label_value=label_value
        )
        model_outs.append(batch)

    def target_values(
        timestamps: list[float] | None = None, time_mock: Mock | None = None
    ) -> dict[str, Tensor]:
        if n_classes:
            kwargs["number_of_classes"] = n_classes
        if zero_weights:
            kwargs["allow_missing_label_with_zero_weight"] = True
        metric = target_clazz(
            world_size=world_size,
            my_rank=my_rank,
            batch_size=batch_size,
            tasks=tasks,
            compute_mode=target_compute_mode,
            window_size=world_size * batch_size * batch_window_size,
            fused_update_limit=fused_update_limit,
            compute_on_all_ranks=compute_on_all_ranks,
            should_validate_update=should_validate_update,
            **kwargs,
        ).to(device)
        for i in range(nsteps):
            labels, predictions, weights, required = parse_task_model_outputs(
                tasks, model_outs[i], list(metric.get_required_inputs())
            )
            if target_compute_mode in (
                RecComputeMode.FUSED_TASKS_COMPUTATION,
                RecComputeMode.FUSED_TASKS_AND_STATES_COMPUTATION,
            ):
                labels, predictions, weights = (
                    torch.stack(list(d.values())) for d in (labels, predictions, weights)
                )
            if timestamps is not None and time_mock is not None:
                time_mock.return_value = timestamps[i]
            metric.update(predictions=predictions, labels=labels, weights=weights, required_inputs=required)
        values = metric.compute()
        values.update(metric.local_compute())
        return values

    def reference_values(timestamps: list[float] | None = None) -> TestRecMetricOutput:
        if test_clazz is None:
            return ({}, {}, {}, {})
        return test_clazz(world_size, tasks).compute(model_outs, nsteps, batch_window_size, timestamps)

    if not is_time_dependent:
        return target_values(), reference_values()
    if time_dependent_metric is None:
        raise ValueError("is_time_dependent needs time_dependent_metric: the module path whose time to mock")
    timestamps = gen_test_timestamps(nsteps)
    with patch(time_dependent_metric[target_clazz] + ".time.monotonic") as time_mock:
        result = target_values(timestamps, time_mock)
    return result, reference_values(timestamps)


def get_launch_config(world_size: int, rdzv_endpoint: str) -> pet.LaunchConfig:
    return pet.LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint,
        rdzv_configs={"store_type": "file"},
        start_method="spawn",
        monitor_interval=1,
        max_restarts=0,
    )


def _launch(world_size: int, entry_point: Callable[..., None], *args: Any) -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        config = get_launch_config(world_size, os.path.join(tmpdir, "rdzv"))
        pet.elastic_launch(config, entrypoint=entry_point)(*args)


def rec_metric_gpu_sync_test_launcher(
    target_clazz: type[RecMetric],
    target_compute_mode: RecComputeMode,
    test_clazz: type[TestMetric] | None,
    metric_name: str,
    task_names: list[str],
    fused_update_limit: int,
    compute_on_all_ranks: bool,
    should_validate_update: bool,
    world_size: int,
    entry_point: Callable[..., None],
    batch_size: int = BATCH_SIZE,
    batch_window_size: int = BATCH_WINDOW_SIZE,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> None:
    _launch(
        world_size,
        entry_point,
        target_clazz,
        target_compute_mode,
        test_clazz,
        task_names,
        metric_name,
        world_size,
        fused_update_limit,
        compute_on_all_ranks,
        should_validate_update,
        batch_size,
        batch_window_size,
        kwargs.get("n_classes"),
        False,
        torch.device(device or "cpu"),
    )


def _assert_metric_results(
    test_metrics: TestRecMetricOutput, task_names: list[str], res: dict[str, Tensor], metric_name: str
) -> None:
    task = task_names[0]
    if metric_name == "serving_calibration":
        key = f"{metric_name}-{task}|window_calibration"
    elif metric_name == "effective_sample_rate":
        key = f"effective_rate-{task}|window_{metric_name}"
    elif metric_name in ("label_average", "prediction_average"):
        key = f"average-{task}|window_{metric_name}"
    else:
        key = f"{metric_name}-{task}|window_{metric_name}"
    torch.testing.assert_close(test_metrics[1][task].squeeze(), res[key].squeeze(), rtol=1e-05, atol=1e-08)


def _update_times(
    metric: RecMetric, tasks: list[RecTaskInfo], model_out: dict[str, Tensor], times: int
) -> None:
    required_names = list(metric.get_required_inputs())
    for _ in range(times):
        labels, predictions, weights, required = parse_task_model_outputs(tasks, model_out, required_names)
        metric.update(predictions=predictions, labels=labels, weights=weights, required_inputs=required)


def sync_test_helper(
    target_clazz: type[RecMetric],
    target_compute_mode: RecComputeMode,
    test_clazz: type[TestMetric] | None,
    task_names: list[str],
    metric_name: str,
    world_size: int,
    fused_update_limit: int = 0,
    compute_on_all_ranks: bool = False,
    should_validate_update: bool = False,
    batch_size: int = BATCH_SIZE,
    batch_window_size: int = BATCH_WINDOW_SIZE,
    n_classes: int | None = None,
    zero_weights: bool = False,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> None:
    """Ranks update different numbers of times (3 and 1, then 1 and 3); rank 0's window must be the
    reference's over the union."""
    device = torch.device(device or "cpu")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend="gloo", world_size=world_size, rank=rank)
    tasks = gen_test_tasks(task_names)
    if n_classes:
        kwargs["number_of_classes"] = n_classes
    metric = target_clazz(
        world_size=world_size,
        batch_size=batch_size,
        my_rank=rank,
        compute_on_all_ranks=compute_on_all_ranks,
        tasks=tasks,
        window_size=batch_window_size * world_size,
        **kwargs,
    ).to(device)
    model_out = _tasks_batch(tasks, batch_size, n_classes, device, seed=42)  # the same batch on every rank
    test_metrics: TestRecMetricOutput = ({}, {}, {}, {})
    if test_clazz is not None:
        # the reference cannot update ranks unevenly: two steps of the batch on every rank match in total
        test_metrics = test_clazz(world_size, tasks).compute([model_out] * 2, 2, batch_window_size, None)
    for uneven in ({0: 3, 1: 1}, {0: 1, 1: 3}):
        metric.reset()
        _update_times(metric, tasks, model_out, uneven.get(rank, 0))
        res = metric.compute()
        if rank == 0:
            _assert_metric_results(test_metrics, task_names, res, metric_name)
    dist.destroy_process_group()


def rec_metric_value_test_launcher(
    target_clazz: type[RecMetric],
    target_compute_mode: RecComputeMode,
    test_clazz: type[TestMetric],
    metric_name: str,
    task_names: list[str],
    fused_update_limit: int,
    compute_on_all_ranks: bool,
    should_validate_update: bool,
    world_size: int,
    entry_point: Callable[..., None],
    batch_window_size: int = BATCH_WINDOW_SIZE,
    test_nsteps: int = 1,
    n_classes: int | None = None,
    zero_weights: bool = False,
    zero_labels: bool = False,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> None:
    """One single-process run of the target (no reference), then ``entry_point`` on ``world_size`` ranks."""
    rec_metric_value_test_helper(
        target_clazz,
        target_compute_mode,
        test_clazz=None,
        fused_update_limit=fused_update_limit,
        compute_on_all_ranks=compute_on_all_ranks,
        should_validate_update=should_validate_update,
        world_size=1,
        my_rank=0,
        task_names=task_names,
        batch_size=32,
        nsteps=test_nsteps,
        batch_window_size=1,
        n_classes=n_classes,
        zero_weights=zero_weights,
        zero_labels=zero_labels,
        device=device,
        **kwargs,
    )
    _launch(
        world_size,
        entry_point,
        target_clazz,
        target_compute_mode,
        task_names,
        test_clazz,
        metric_name,
        fused_update_limit,
        compute_on_all_ranks,
        should_validate_update,
        batch_window_size,
        n_classes,
        test_nsteps,
        zero_weights,
        device,
    )


def rec_metric_accuracy_test_helper(world_size: int, entry_point: Callable[..., None]) -> None:
    _launch(world_size, entry_point)


def metric_test_helper(
    target_clazz: type[RecMetric],
    target_compute_mode: RecComputeMode,
    task_names: list[str],
    test_clazz: type[TestMetric],
    metric_name: str,
    fused_update_limit: int = 0,
    compute_on_all_ranks: bool = False,
    should_validate_update: bool = False,
    batch_window_size: int = BATCH_WINDOW_SIZE,
    n_classes: int | None = None,
    nsteps: int = 1,
    zero_weights: bool = False,
    device: str | torch.device | None = None,
    is_time_dependent: bool = False,
    time_dependent_metric: dict[type[RecMetric], str] | None = None,
    **kwargs: Any,
) -> None:
    """On each launched rank: the target's four values must equal the reference's (checked on rank 0)."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend="gloo", world_size=world_size, rank=rank)
    target, reference = rec_metric_value_test_helper(
        target_clazz=target_clazz,
        target_compute_mode=target_compute_mode,
        test_clazz=test_clazz,
        fused_update_limit=fused_update_limit,
        compute_on_all_ranks=False,
        should_validate_update=should_validate_update,
        world_size=world_size,
        my_rank=rank,
        task_names=task_names,
        batch_window_size=batch_window_size,
        n_classes=n_classes,
        nsteps=nsteps,
        is_time_dependent=is_time_dependent,
        time_dependent_metric=time_dependent_metric,
        zero_weights=zero_weights,
        device=device,
        **kwargs,
    )
    if rank == 0:
        namespace = str(target_clazz._namespace)
        prefixes = ["window_", "local_window_"]
        if namespace not in _WINDOW_ONLY_NAMESPACES:
            prefixes += ["lifetime_", "local_lifetime_"]
        which = {"lifetime_": 0, "window_": 1, "local_lifetime_": 2, "local_window_": 3}
        for name in task_names:
            for prefix in prefixes:
                torch.testing.assert_close(
                    target[f"{namespace}-{name}|{prefix}{metric_name}"].squeeze(),
                    reference[which[prefix]][name].squeeze(),
                    rtol=1e-05,
                    atol=1e-08,
                )
    dist.destroy_process_group()
