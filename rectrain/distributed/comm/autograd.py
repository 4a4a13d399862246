"""Autograd-aware primitive collectives: each forward starts one collective, each backward runs its adjoint.

Adjoint pairs (the gradient of a linear map is its transpose):
  all-to-all (splits in, splits out)  <->  all-to-all with the splits swapped
  all-gather along dim 0              <->  reduce-scatter (sum) along dim 0
Forward always launches asynchronously and leaves the work handle in a ``WorkBox``; the caller waits on
it before reading the output (``comm.ops`` wraps this in a ``Pending``). Autograd never reads
the output's values, so recording the graph before the data has arrived is safe. Backward is synchronous.
Everything else the public functions do (padding, slicing, summing, reshaping) is ordinary tensor code that
autograd differentiates on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd import Function

from rectrain import compat
from rectrain.distributed.comm.timeouts import collective

# TorchRec's process-wide switch (``torchrec.distributed.comm_ops.set_gradient_division``, set through
# ``rectrain.distributed.comm_ops``): when on, every backward here divides by the group's size, so the
# sharded tables get the gradient of the mean of the ranks' losses, as DDP gives the dense part. On by
# default, as TorchRec's: a ported program's tables learn at the rate it was tuned for.
_gradient_division = {"on": True}


def set_gradient_division(value: bool) -> None:
    _gradient_division["on"] = bool(value)


def get_gradient_division() -> bool:
    return _gradient_division["on"]


def divided_gradient(grad: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """``grad`` divided (in place) by the group's size when gradient division is on."""
    return grad.div_(dist.get_world_size(group)) if _gradient_division["on"] else grad


@dataclass
class WorkBox:
    """Carries the work handle out of an autograd ``Function.forward`` (which may only return tensors)."""

    work: dist.Work | None = None


class AllToAllSingle(Function):
    """``dist.all_to_all_single`` along dim 0 with explicit splits; backward is the reverse all-to-all."""

    @staticmethod
    def forward(
        ctx,
        box: WorkBox,
        tensor: Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        group: dist.ProcessGroup | None,
    ) -> Tensor:
        ctx.splits = (list(output_split_sizes), list(input_split_sizes))
        ctx.group = group
        out = tensor.new_empty((sum(output_split_sizes), *tensor.shape[1:]))
        box.work = dist.all_to_all_single(
            out, tensor.contiguous(), list(output_split_sizes), list(input_split_sizes), group, async_op=True
        )
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        output_split_sizes, input_split_sizes = ctx.splits
        grad_in = grad.new_empty((sum(input_split_sizes), *grad.shape[1:]))
        with collective("all_to_all_single (backward)", ctx.group):
            dist.all_to_all_single(
                grad_in, grad.contiguous(), input_split_sizes, output_split_sizes, ctx.group
            )
        return None, divided_gradient(grad_in, ctx.group), None, None, None


class AllGatherEven(Function):
    """All-gather of equally sized tensors, concatenated along dim 0; backward is reduce-scatter (sum)."""

    @staticmethod
    def forward(ctx, box: WorkBox, tensor: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        world_size = dist.get_world_size(group)
        out = tensor.new_empty((world_size * tensor.shape[0], *tensor.shape[1:]))
        box.work = compat.all_gather_single(out, tensor.contiguous(), group, async_op=True)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        world_size = dist.get_world_size(ctx.group)
        grad_in = grad.new_empty((grad.shape[0] // world_size, *grad.shape[1:]))
        with collective("reduce_scatter (all_gather backward)", ctx.group):
            compat.reduce_scatter_single(grad_in, grad.contiguous(), dist.ReduceOp.SUM, ctx.group)
        return None, divided_gradient(grad_in, ctx.group), None


def comm_device(group: dist.ProcessGroup | None) -> torch.device:
    """The device small bookkeeping tensors (split sizes) must live on for ``group``'s backend."""
    if "nccl" in str(dist.get_backend(group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
