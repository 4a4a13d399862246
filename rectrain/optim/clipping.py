"""``GradientClippingOptimizer``: clip gradients, then step the wrapped optimizer (TorchRec's clipping).

Clipping by norm covers every parameter of the wrapped optimizer; with ``enable_global_grad_clip`` and
``param_to_pgs``, a sharded parameter's norm is summed over its process groups so that all ranks clip by the
norm of the whole model. Clipping by value is local. ``last_total_grad_norm`` keeps the latest total norm.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from enum import Enum, unique
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from rectrain.optim.keyed import KeyedOptimizer, OptimizerWrapper

logger = logging.getLogger(__name__)


@unique
class GradientClipping(Enum):
    NORM = "norm"
    VALUE = "value"
    NONE = "none"


def _get_grads(params: list[Tensor]) -> list[Tensor]:
    """The non-empty gradients of ``params`` (a DTensor's local part)."""
    grads = [p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad for p in params]
    return [g for g in grads if g is not None and g.numel() > 0]


def _batch_cal_norm(
    grad_list: list[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    process_groups: tuple[dist.ProcessGroup, ...] | None = None,
) -> Tensor:
    """The p-th power of the gradients' p-norm (inf-norm: their max), reduced over ``process_groups``."""
    infinite = norm_type == torch.inf
    if infinite:
        grad_list = [g for g in grad_list if g.numel() > 0]
        if not grad_list:
            return torch.tensor(float("-inf"))
    norms = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grad_list, norm_type)), norm_type)
    if not infinite:
        norms = norms**norm_type
    for group in process_groups or ():
        dist.all_reduce(norms, op=dist.ReduceOp.MAX if infinite else dist.ReduceOp.SUM, group=group)
    return norms


def _compute_total_norm(
    replicate_grads: list[Tensor],
    sharded_grads: dict[tuple[dist.ProcessGroup, ...], list[Tensor]],
    norm_type: float = 2.0,
    max_grad_norm: float = 1.0,
) -> Tensor:
    """The p-norm of all gradients: replicated ones local, sharded ones reduced over their groups."""
    infinite = norm_type == torch.inf
    combine = torch.maximum if infinite else torch.add
    start = float("-inf") if infinite else 0.0
    sharded = torch.tensor(start)
    for groups, grads in sharded_grads.items():
        norm = _batch_cal_norm(grads, max_grad_norm, norm_type, groups)
        sharded = combine(sharded.to(norm.device), norm)
    replicated = (
        _batch_cal_norm(replicate_grads, max_grad_norm, norm_type) if replicate_grads else torch.tensor(start)
    )
    total = combine(replicated.to(sharded.device), sharded)
    return total if infinite else total.pow(1.0 / norm_type)


class GradientClippingOptimizer(OptimizerWrapper):
    """Clips the wrapped optimizer's gradients before each step.

    Args:
        optimizer: the optimizer to wrap.
        clipping: by norm, by value, or not at all.
        max_gradient: the norm or value bound.
        norm_type: the p of the p-norm (``"inf"`` allowed).
        enable_global_grad_clip: clip sharded parameters by the global norm (needs ``param_to_pgs``).
        param_to_pgs: parameter -> the process groups its shards span.
        track_grad_norm: also record the norm when not clipping by norm.
    """

    def __init__(
        self,
        optimizer: KeyedOptimizer,
        clipping: GradientClipping = GradientClipping.NONE,
        max_gradient: float = 0.1,
        norm_type: float | str = 2.0,
        enable_global_grad_clip: bool = False,
        param_to_pgs: dict[torch.nn.Parameter, list[dist.ProcessGroup]] | None = None,
        track_grad_norm: bool = False,
    ) -> None:
        super().__init__(optimizer)
        self._clipping, self._max_gradient, self._norm_type = clipping, max_gradient, float(norm_type)
        self._enable_global_grad_clip, self._track_grad_norm = enable_global_grad_clip, track_grad_norm
        self._check_meta, self._step_num = True, 0
        self._last_total_grad_norm: Tensor | None = None
        self._replicate_params: list[Tensor] = []
        self._sharded_params: dict[tuple[dist.ProcessGroup, ...], list[Tensor]] = defaultdict(list)
        for group in self.param_groups:
            for param in group["params"]:
                groups = (param_to_pgs or {}).get(param) if enable_global_grad_clip else None
                if groups:
                    self._sharded_params[tuple(groups)].append(param)
                else:
                    self._replicate_params.append(param)
        if clipping is GradientClipping.VALUE and self._sharded_params:
            raise NotImplementedError("clipping sharded parameters by value is not supported; clip by norm")

    @property
    def last_total_grad_norm(self) -> Tensor | None:
        """The total gradient norm of the latest step (None before the first)."""
        return self._last_total_grad_norm

    def _on_meta(self) -> bool:
        params = [*self._replicate_params, *(p for ps in self._sharded_params.values() for p in ps)]
        return any(p.device.type == "meta" for p in params)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if self._check_meta:
            if self._on_meta():  # nothing to clip on a model that is not materialised yet
                self._last_total_grad_norm = None
                super().step(closure)
                return
            self._check_meta = False
        if self._clipping is GradientClipping.NORM:
            self._last_total_grad_norm = self._clip_by_norm()
        else:
            if self._track_grad_norm:
                self._last_total_grad_norm, _ = self.compute_total_grad_norm()
            if self._clipping is GradientClipping.VALUE:
                torch.nn.utils.clip_grad_value_(self._replicate_params, clip_value=self._max_gradient)
        super().step(closure)
        self._step_num += 1

    def _clip_by_norm(self) -> Tensor | None:
        if self._sharded_params:
            return self.clip_grad_norm_()
        local = [p._local_tensor if isinstance(p, DTensor) else p for p in self._replicate_params]
        local = [p for p in local if p.grad is not None and p.grad.numel() > 0]
        if not local:
            return None
        return torch.nn.utils.clip_grad_norm_(local, max_norm=self._max_gradient, norm_type=self._norm_type)

    def compute_total_grad_norm(self) -> tuple[Tensor, list[Tensor]]:
        """The total gradient norm without clipping, and the gradients it covers."""
        sharded = {groups: _get_grads(params) for groups, params in self._sharded_params.items()}
        replicated = _get_grads(self._replicate_params)
        grads = [g for gs in sharded.values() for g in gs] + replicated
        return _compute_total_norm(replicated, sharded, self._norm_type, self._max_gradient), grads

    def clip_grad_norm_(self) -> Tensor:
        """Scale every gradient so that the total norm is at most ``max_gradient``; returns the norm."""
        total, grads = self.compute_total_grad_norm()
        torch._foreach_mul_(grads, torch.clamp(self._max_gradient / (total + 1e-6), max=1.0))
        return total
