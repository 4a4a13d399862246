"""Model outputs to metric inputs, TorchRec's ``metrics.model_utils``: a model's output dict (label,
prediction and weight tensors named by each ``RecTaskInfo``) becomes per-task dicts of 1-D tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.metrics.metrics_config import RecTaskInfo


def is_empty_signals(labels: Tensor, predictions: Tensor, weights: Tensor) -> bool:
    return labels.numel() <= 0 and predictions.numel() <= 0 and weights.numel() <= 0


def parse_model_outputs(
    label_name: str, prediction_name: str, weight_name: str, model_out: dict[str, Tensor]
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """A task's (labels, predictions, weights), squeezed; predictions and weights are None for a label-only
    task (empty ``prediction_name``)."""
    if label_name not in model_out:
        raise ValueError(f"Label name {label_name} not found in model output")
    labels = model_out[label_name].squeeze()
    if not prediction_name:
        if weight_name:
            raise ValueError("weight name must be empty if prediction name is empty")
        return labels, None, None
    if prediction_name not in model_out:
        raise ValueError(f"Prediction name {prediction_name} not found in model output")
    if weight_name not in model_out:
        raise ValueError(f"Weight {weight_name} not found in model output")
    predictions = model_out[prediction_name].squeeze()
    weights = model_out[weight_name].squeeze()
    if not is_empty_signals(labels, predictions, weights):
        _check_sizes(labels, predictions, weights)
        if labels.dim() == 0:  # one example: rank 1
            labels, predictions, weights = labels.unsqueeze(0), predictions.unsqueeze(0), weights.unsqueeze(0)
    return labels, predictions, weights


def _check_sizes(labels: Tensor, predictions: Tensor, weights: Tensor) -> None:
    if labels.dim() == predictions.dim():
        vector_valued = (
            labels.dim() == 2
            and weights.dim() == 1
            and labels.size(0) == predictions.size(0) == weights.size(0)
        )
        if not vector_valued and not labels.numel() == predictions.numel() == weights.numel():
            raise ValueError(
                "Expect the same number of elements in labels, predictions, and weights. Instead got "
                f"{labels.numel()}, {predictions.numel()}, {weights.numel()}"
            )
    elif not labels.numel() == predictions.numel() // predictions.size(-1) == weights.numel():
        raise ValueError(
            f"multiclass predictions {tuple(predictions.shape)} do not match labels {tuple(labels.shape)} "
            f"and weights {tuple(weights.shape)}"
        )


def parse_required_inputs(
    model_out: dict[str, Tensor],
    required_inputs_list: list[str],
    ndcg_transform_input: bool = False,
    device: torch.device | None = None,
) -> dict[str, Tensor]:
    return {name: model_out[name].squeeze() for name in required_inputs_list}


def parse_task_model_outputs(
    tasks: list[RecTaskInfo], model_out: dict[str, Tensor], required_inputs_list: list[str] | None = None
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """(labels, predictions, weights, required inputs), each a dict by task name; empty tasks are left out."""
    labels: dict[str, Tensor] = {}
    predictions: dict[str, Tensor] = {}
    weights: dict[str, Tensor] = {}
    for task in tasks:
        task_labels, task_predictions, task_weights = parse_model_outputs(
            task.label_name, task.prediction_name, task.weight_name, model_out
        )
        if task_predictions is not None and task_weights is not None:
            if not is_empty_signals(task_labels, task_predictions, task_weights):
                labels[task.name] = task_labels
                predictions[task.name] = task_predictions
                weights[task.name] = task_weights
        elif task_labels.numel() > 0:
            labels[task.name] = task_labels
    required = (
        parse_required_inputs(model_out, required_inputs_list) if required_inputs_list is not None else {}
    )
    return labels, predictions, weights, required
