"""Run a function at a chosen point of the backward pass (``torchrec...train_pipeline.backward_injection``).

A site is a module (by FQN) and how to hook it: ``PARAM_GRAD`` hooks one of its parameters after its
gradient is accumulated (``hook_position`` in [0, 1] picks it among all the module's parameters, walking to
the nearest one that can fire: a leaf that requires grad and is not a ``ShardedTensor``, whose fused kernels
write gradients without hooks); ``ACTIVATION`` hooks, on every forward, the tensor its ``tensor_finder``
picks from the module's input or output. Pipelines use it to overlap work (a sync, a prefetch) with backward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum, unique
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from rectrain.distributed.interfaces.awaitable import NoWait
from rectrain.planner.types import ShardingType
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor

logger = logging.getLogger(__name__)


@unique
class InjectionTargetType(Enum):
    PARAM_GRAD = "param_grad"
    ACTIVATION = "activation"


@runtime_checkable
class GradTensorFinder(Protocol):
    """Picks the tensor to hook from a module's ``(input, kwargs, output)``; ``None`` if there is none."""

    def __call__(
        self, module_input: Any, module_kwargs_input: Any, module_output: Any
    ) -> torch.Tensor | None: ...


def _first_grad_tensor(data: Any) -> torch.Tensor | None:
    if isinstance(data, torch.Tensor):
        return data if data.requires_grad else None
    if isinstance(data, (KeyedJaggedTensor, JaggedTensor)):  # trainable weights, e.g. position weights
        weights = data.weights_or_none()
        return weights if weights is not None and weights.requires_grad else None
    items = data.values() if isinstance(data, dict) else data if isinstance(data, (tuple, list)) else ()
    return next((t for t in map(_first_grad_tensor, items) if t is not None), None)


@dataclass(frozen=True)
class FirstGradTensorFinder:
    """The first tensor that requires grad in the output (``use_input``: the input, then the kwargs)."""

    use_input: bool = False

    def __call__(
        self, module_input: Any, module_kwargs_input: Any, module_output: Any
    ) -> torch.Tensor | None:
        found = _first_grad_tensor(module_input if self.use_input else module_output)
        if found is None and self.use_input:
            found = _first_grad_tensor(module_kwargs_input)
        return found


@dataclass(frozen=True)
class OutputDistTensorFinder:
    """The ``dummy_tensor`` of a sharded EC/EBC output awaitable's all-to-all for ``sharding_type``."""

    sharding_type: ShardingType = ShardingType.TABLE_WISE

    def __call__(
        self, module_input: Any, module_kwargs_input: Any, module_output: Any
    ) -> torch.Tensor | None:
        output = module_output[0] if isinstance(module_output, tuple) else module_output
        awaitables = getattr(output, "_awaitables", getattr(output, "_awaitables_per_sharding", None))
        sharding_types = getattr(output, "_sharding_types", None)
        if awaitables is None or sharding_types is None:
            raise RuntimeError(f"Unsupported awaitable type: {type(output).__name__}")
        for waiting, sharding_type in zip(awaitables, sharding_types):
            if not isinstance(waiting, NoWait) and ShardingType(sharding_type) == self.sharding_type:
                return getattr(getattr(waiting, "_tensor_awaitable", None), "dummy_tensor", None)
        raise RuntimeError(f"Could not find awaitable for sharding type: {self.sharding_type}")


@dataclass(frozen=True)
class InjectionSite:
    """A module FQN, the tensor finder (``ACTIVATION``), the hook kind and the parameter position."""

    fqn: str
    tensor_finder: GradTensorFinder
    target_type: InjectionTargetType = InjectionTargetType.ACTIVATION
    hook_position: float = 1.0


def register_backward_hook(
    site: InjectionSite, model: nn.Module, hook_fn: Callable[[torch.Tensor], None]
) -> torch.utils.hooks.RemovableHandle:
    """Hook ``hook_fn(grad)`` at ``site`` in ``model``; the handle removes it."""
    try:
        target = model.get_submodule(site.fqn)
    except AttributeError:
        raise ValueError(f"register_backward_hook: module '{site.fqn}' not found in model.") from None
    if site.target_type == InjectionTargetType.PARAM_GRAD:
        return _register_param_grad_hook(site, target, hook_fn)
    if site.target_type == InjectionTargetType.ACTIVATION:
        return _register_activation_hook(site, target, hook_fn)
    raise ValueError(f"register_backward_hook: unknown target_type '{site.target_type}'.")


def will_hook_fire(p: torch.Tensor) -> bool:
    return p.is_leaf and p.requires_grad and type(p).__name__ != "ShardedTensor"


def _position_to_index(position: float, length: int) -> int:
    return min(int(max(0.0, min(1.0, position)) * length), length - 1)


def _walk_outward(start: int, n: int) -> Iterator[int]:
    """``start, start+1, start-1, start+2, ...`` within ``[0, n)``."""
    for distance in range(n):
        yield from (i for i in dict.fromkeys((start + distance, start - distance)) if 0 <= i < n)


def _register_param_grad_hook(
    site: InjectionSite, target: nn.Module, hook_fn: Callable[[torch.Tensor], None]
) -> torch.utils.hooks.RemovableHandle:
    named = list(target.named_parameters())
    wanted = _position_to_index(site.hook_position, len(named)) if named else 0
    chosen = next((i for i in _walk_outward(wanted, len(named)) if will_hook_fire(named[i][1])), None)
    if chosen is None:
        kinds = [type(p).__name__ == "ShardedTensor" for _, p in named]
        no_grad = sum(not p.requires_grad for _, p in named)
        sharded = sum(k and p.requires_grad for k, (_, p) in zip(kinds, named))
        raise AssertionError(
            f"register_backward_hook: no hookable parameter in module '{site.fqn}' (total={len(named)}, "
            f"no_requires_grad={no_grad}, ShardedTensor={sharded}, "
            f"non_leaf={len(named) - no_grad - sharded}); need is_leaf + requires_grad + not ShardedTensor."
        )
    name, param = named[chosen]
    logger.info("register_backward_hook: hooking %s.%s (%d of %d)", site.fqn, name, chosen, len(named))
    # A post-accumulate hook fires once the gradient is complete, whoever writes it (FSDP2 too).
    return param.register_post_accumulate_grad_hook(lambda p: hook_fn(p.grad))


def _register_activation_hook(
    site: InjectionSite, target: nn.Module, hook_fn: Callable[[torch.Tensor], None]
) -> torch.utils.hooks.RemovableHandle:
    def _forward_hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        tensor = site.tensor_finder(args, kwargs, output)
        if tensor is None:
            raise RuntimeError(f"register_backward_hook: no grad-requiring tensor in output of '{site.fqn}'.")
        tensor.register_hook(hook_fn)

    return target.register_forward_hook(_forward_hook, with_kwargs=True)
