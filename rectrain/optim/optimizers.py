"""``torchrec.optim.optimizers`` at rectrain's path: optimizer classes for ``apply_optimizer_in_backward`` and
the filter that tells in-backward parameters from the rest.

TorchRec's ``SGD`` / ``Adagrad`` / ``Adam`` here are placeholders that only name a fused kernel; rectrain's
are the torch optimizers themselves, so they also train an unsharded model. ``DistributedModelParallel`` maps
them, and ``RowWiseAdagrad``, to its fused kernels.
TorchRec's other fused-only optimizers have no rectrain kernel: constructing one raises, so
``apply_optimizer_in_backward`` refuses them where they are given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from rectrain.errors import ConfigError


def in_backward_optimizer_filter(
    named_parameters: Iterable[tuple[str, nn.Parameter]], include: bool = False
) -> Iterator[tuple[str, nn.Parameter]]:
    """The parameters without an in-backward optimizer (``include=True``: only those with one).

    An in-backward optimizer is torch's ``_apply_optimizer_in_backward`` (``param._in_backward_optimizers``);
    rectrain's fused tables carry one too, as TorchRec's do, so a dense optimizer built from the rest never
    steps them.
    """
    for name, param in named_parameters:
        if hasattr(param, "_in_backward_optimizers") == include:
            yield name, param


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` under TorchRec's name (fused as exact SGD when sharded)."""


class Adagrad(torch.optim.Adagrad):
    """``torch.optim.Adagrad`` under TorchRec's name (fused as exact Adagrad when sharded)."""


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` under TorchRec's name (fused as Adam when sharded)."""


class _WithoutKernel(torch.optim.Optimizer):
    """A TorchRec fused-only optimizer rectrain has no kernel for: refused where it is constructed."""

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        raise ConfigError(
            f"{type(self).__name__} is one of TorchRec's fused-only optimizers and rectrain has no kernel "
            "for it; use SGD, Adagrad, Adam or RowWiseAdagrad"
        )


class LarsSGD(_WithoutKernel):
    """TorchRec's fused LARS SGD (no rectrain kernel)."""


class LAMB(_WithoutKernel):
    """TorchRec's fused LAMB (no rectrain kernel)."""


class PartialRowWiseLAMB(_WithoutKernel):
    """TorchRec's fused partial row-wise LAMB (no rectrain kernel)."""


class PartialRowWiseAdam(_WithoutKernel):
    """TorchRec's fused partial row-wise Adam (no rectrain kernel)."""
