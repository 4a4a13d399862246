"""Dense optimizer state without pickle: a torch optimizer's ``state_dict()`` as JSON plus named tensors.

``flatten`` turns the nested state dict into a JSON tree in which every tensor is replaced by
``{"__tensor__": name}`` (the tensor goes into ``dense.safetensors`` under that name), tuples by
``{"__tuple__": [...]}`` and dicts keyed by anything but plain strings by ``{"__dict__": [[key, value]]}``
(torch keys its per-parameter state by int). ``unflatten`` reverses it. Fused embedding optimizers are
skipped: their state is saved with the table shards, so it can be re-sharded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rectrain.checkpoint.errors import CheckpointError, CheckpointMismatchError
from rectrain.optim import CombinedOptimizer, FusedEmbeddingOptimizer

_SCALARS = (str, int, float, bool, type(None))


def dense_optimizers(
    optimizer: torch.optim.Optimizer | None, name: str = ""
) -> dict[str, torch.optim.Optimizer]:
    """``{name: optimizer}`` of every non-fused optimizer inside ``optimizer`` (combined ones walked; nested
    names joined by ``/``; a lone optimizer is ``"optimizer"``)."""
    if optimizer is None or isinstance(optimizer, FusedEmbeddingOptimizer):
        return {}
    if isinstance(optimizer, CombinedOptimizer):
        found = {}
        for member_name, member in optimizer.optimizers:
            found.update(dense_optimizers(member, f"{name}/{member_name}" if name else member_name))
        return found
    return {name or "optimizer": optimizer}


def flatten(value: Any, path: str, tensors: dict[str, Tensor], copy: bool) -> Any:
    """The JSON tree of ``value``; tensors are added to ``tensors`` under their path (cloned if ``copy``)."""
    if isinstance(value, Tensor):
        tensor = value.detach()
        tensors[path] = tensor.to("cpu", copy=True) if copy else tensor.cpu().contiguous()
        return {"__tensor__": path}
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, _SCALARS):
                raise CheckpointError(f"optimizer state {path}: key {key!r} is not a JSON scalar")
            items.append([key, flatten(item, f"{path}/{key}", tensors, copy)])
        if all(isinstance(key, str) and not key.startswith("__") for key, _ in items):
            return dict(items)
        return {"__dict__": items}
    if isinstance(value, (list, tuple)):
        items = [flatten(item, f"{path}/{i}", tensors, copy) for i, item in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, _SCALARS):
        return value
    raise CheckpointError(
        f"optimizer state {path}: cannot store a {type(value).__name__} ({value!r:.60}) without pickle"
    )


def unflatten(tree: Any, read: Callable[[str], Tensor]) -> Any:
    """Rebuild what :func:`flatten` flattened; ``read(name)`` returns a stored tensor."""
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            return read(tree["__tensor__"])
        if "__tuple__" in tree:
            return tuple(unflatten(item, read) for item in tree["__tuple__"])
        if "__dict__" in tree:
            return {key: unflatten(item, read) for key, item in tree["__dict__"]}
        return {key: unflatten(item, read) for key, item in tree.items()}
    if isinstance(tree, list):
        return [unflatten(item, read) for item in tree]
    return tree


def check_state_shapes(name: str, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Every saved per-parameter tensor with more than one element must have its parameter's shape.

    torch's ``load_state_dict`` matches state to parameters by position only; this catches an optimizer
    built over different parameters (or in a different order) than the one that was saved.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in state_dict.get("param_groups", []) for i in group.get("params", [])]
    if len(saved_ids) != len(params):
        raise CheckpointMismatchError(
            f"dense optimizer {name!r}: the checkpoint has {len(saved_ids)} parameters, "
            f"the optimizer {len(params)}"
        )
    position = {saved: i for i, saved in enumerate(saved_ids)}
    for saved_id, values in state_dict.get("state", {}).items():
        param = params[position[saved_id]] if saved_id in position else None
        for key, value in values.items():
            if (
                param is not None
                and isinstance(value, Tensor)
                and value.numel() > 1
                and value.shape != param.shape
            ):
                raise CheckpointMismatchError(
                    f"dense optimizer {name!r}: state {key!r} of parameter {position[saved_id]} has shape "
                    f"{list(value.shape)} in the checkpoint, the parameter {list(param.shape)}"
                )
