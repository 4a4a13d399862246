"""Learning-rate schedules and dense gradient clipping, from the ``[optimizer]`` table.

The schedule is a factor of the configured learning rates (``dense_lr`` and ``sparse_lr`` alike, as
TorchRec's ``WarmupOptimizer`` scales every param group): a linear warm-up from ``warmup_start`` to 1 over
``warmup_steps``, then 1 until ``decay_start``, then ``decay`` down to ``min_lr_ratio`` over ``decay_steps``
(``polynomial`` with ``decay_power``, MLPerf DLRM's choice; ``linear``; ``cosine``; or ``constant``: none).
The factor is a function of the global step only, so a resumed run continues the same curve, and the
configured rates win over those stored in a checkpoint. The fused embedding optimizers take the rate
through their ``param_groups[i]["lr"]`` (pushed to the kernels when set).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

DECAYS = ("constant", "linear", "polynomial", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    """``factor(step)``: the multiplier of the base learning rates for the step about to run (0-based)."""

    warmup_steps: int = 0
    warmup_start: float = 0.0
    decay: str = "constant"
    decay_start: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0
    min_lr_ratio: float = 0.0

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_start + (1.0 - self.warmup_start) * (step + 1) / self.warmup_steps
        start = max(self.decay_start, self.warmup_steps)
        if self.decay == "constant" or step < start:
            return 1.0
        done = min(1.0, (step - start) / max(1, self.decay_steps))
        if self.decay == "linear":
            shape = 1.0 - done
        elif self.decay == "polynomial":
            shape = (1.0 - done) ** self.decay_power
        else:
            shape = 0.5 * (1.0 + math.cos(math.pi * done))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape


class ScheduledLR:
    """Sets every param group's ``lr`` to its base rate times ``schedule.factor(step)`` before each step."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule) -> None:
        self.optimizer, self.schedule = optimizer, schedule
        self.base_lrs = [float(group["lr"]) for group in optimizer.param_groups]

    def apply(self, step: int) -> None:
        """Set the rates for step ``step`` (0-based: the number of steps already taken)."""
        factor = self.schedule.factor(step)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            if group["lr"] != base * factor:
                group["lr"] = base * factor


def clip_before_step(
    optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter], max_norm: float
) -> None:
    """Clip the total gradient norm of ``params`` to ``max_norm`` before every ``optimizer.step()``."""
    params = list(params)

    def clip(*_: object) -> None:
        nn.utils.clip_grad_norm_(params, max_norm)

    optimizer.register_step_pre_hook(clip)
