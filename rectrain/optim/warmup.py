"""``WarmupOptimizer``: a learning-rate schedule of stages applied around another optimizer
(``torchrec.optim.warmup``).

Each stage runs until its ``max_iters`` (iterations counted from the start of training) and scales the base
``lr`` by its policy's multiplier at the iteration; after the last stage the base rate applies. The position
(iteration, stage) is optimizer state under a placeholder parameter, so it is checkpointed and restored.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from enum import Enum, unique
from typing import Any

import torch

from rectrain.optim.keyed import KeyedOptimizer, OptimizerWrapper

logger = logging.getLogger(__name__)


@unique
class WarmupPolicy(Enum):
    NONE = "none"
    LINEAR = "linear"
    CONSTANT = "constant"
    POLY = "poly"
    STEP = "step"
    INVSQRT = "inv_sqrt"
    COSINE_ANNEALING_WARM_RESTARTS = "cosine_annealing_warm_restarts"
    INTERPOLATE = "interpolate"


@dataclass
class WarmupStage:
    """One stage. ``decay_iters`` (<= 0: ``max_iters``, or 1 for STEP) is POLY's horizon and STEP's step size;
    ``sgdr_period`` is the cosine restart period; INTERPOLATE goes linearly from ``value`` at
    ``start_interpolating_iters`` to ``end_value`` at ``max_iters``."""

    policy: WarmupPolicy = WarmupPolicy.LINEAR
    max_iters: int = 1
    value: float = 1.0
    lr_scale: float = 1.0
    decay_iters: int = -1
    sgdr_period: int = 1
    start_interpolating_iters: int | None = None
    end_value: float | None = None


def _checked_stages(stages: list[WarmupStage]) -> list[WarmupStage]:
    """The stages with default decay_iters filled in, then an open-ended stage at the base rate."""
    previous = 0
    for position, stage in enumerate(stages):
        if stage.max_iters <= previous:
            raise ValueError(f"stages[{position}].max_iters must exceed the previous stage's ({previous})")
        if stage.policy is WarmupPolicy.INTERPOLATE:
            start = stage.start_interpolating_iters
            if start is None or stage.end_value is None:
                raise ValueError(
                    f"stages[{position}]: INTERPOLATE needs start_interpolating_iters and end_value"
                )
            if stage.max_iters <= start:
                raise ValueError(f"stages[{position}]: max_iters must exceed start_interpolating_iters")
        if stage.decay_iters <= 0:
            stage.decay_iters = 1 if stage.policy is WarmupPolicy.STEP else stage.max_iters
        previous = stage.max_iters
    return [*stages, WarmupStage(policy=WarmupPolicy.NONE, max_iters=1 << 63, value=1.0)]


def _multiplier(stage: WarmupStage, it: int) -> float:
    """The stage's scale of the base rate at iteration ``it``."""
    policy, value = stage.policy, stage.value
    if policy is WarmupPolicy.LINEAR:
        factor = value + (1.0 - value) * it / stage.max_iters
    elif policy is WarmupPolicy.CONSTANT:
        factor = value
    elif policy is WarmupPolicy.POLY:
        factor = math.pow(1 - it / stage.decay_iters, value)
    elif policy is WarmupPolicy.STEP:
        factor = math.pow(value, it // stage.decay_iters)
    elif policy is WarmupPolicy.INVSQRT:
        factor = 1.0 / math.sqrt(it)
    elif policy is WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS:
        position = (it % stage.sgdr_period) / stage.sgdr_period
        factor = value + (1.0 - value) * 0.5 * (1 + math.cos(math.pi * position))
    elif policy is WarmupPolicy.INTERPOLATE:
        start = float(stage.start_interpolating_iters or 0)
        factor = value + (float(stage.end_value) - value) * (it - start) / (stage.max_iters - start)
    else:
        factor = 1.0
    return factor * stage.lr_scale


class WarmupOptimizer(OptimizerWrapper):
    """Sets ``param_group[lr_param]`` of every group to ``lr * multiplier`` before each step.

    Args:
        optimizer: the optimizer to drive.
        stages: the schedule, in order.
        lr: the base learning rate.
        lr_param: the param-group entry that holds the rate.
        param_name: the key of the placeholder parameter holding the schedule's position.
    """

    def __init__(
        self,
        optimizer: KeyedOptimizer,
        stages: list[WarmupStage],
        lr: float = 0.1,
        lr_param: str = "lr",
        param_name: str = "__warmup",
    ) -> None:
        super().__init__(optimizer)
        self._stages = _checked_stages(stages)
        self._lr_param, self._lr = lr_param, lr
        self._warmup_param = torch.nn.Parameter()
        self.params[param_name] = self._warmup_param  # type: ignore[index]
        # A fused optimizer updates in the first backward, before any step(): the rate must be set now.
        self._set_lr(0, 0)

    def _set_lr(self, it: int, stage: int) -> None:
        lr = self._lr * _multiplier(self._stages[stage], it)
        for group in self.param_groups:
            group[self._lr_param] = lr

    def _position(self) -> tuple[int, int]:
        if self._warmup_param in self.state:
            it, stage = self.state[self._warmup_param]["warmup"].tolist()
            return int(it), int(stage)
        return 0, 0

    def post_load_state_dict(self) -> None:
        it, stage = self._position()
        logger.info("WarmupOptimizer set to iteration %d", it)
        self._set_lr(it, stage)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        super().step(closure)
        it, stage = self._position()
        it += 1
        if it > self._stages[stage].max_iters and stage + 1 < len(self._stages):
            stage += 1
            logger.info(
                "WarmupOptimizer: stage %s ends, %s begins", self._stages[stage - 1], self._stages[stage]
            )
        self._set_lr(it, stage)
        self.state[self._warmup_param] = {"warmup": torch.tensor([it, stage], dtype=torch.long)}  # type: ignore[index]
