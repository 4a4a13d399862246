"""Gradient accumulation around any training pipeline (TorchRec's ``train_pipeline.gradient_accumulation``).

The wrapper hands the pipeline an optimizer whose ``step`` runs every ``num_steps`` micro-batches (and whose
``zero_grad`` clears only after a real step), and runs the micro-batches in between under every DDP module's
``no_sync()``, so gradients are all-reduced once per accumulated step. Tables trained by a fused optimizer
update inside backward on every micro-batch, in TorchRec as here: only gradients that reach the optimizer
accumulate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch.nn.parallel import DistributedDataParallel


@dataclass
class GradientAccumulationConfig:
    """``num_steps`` micro-batches per optimizer step; the first ``num_warmup_steps`` always sync (DDP's
    static graph needs synced steps first). ``num_steps > 1`` enables it."""

    is_enabled: bool = False
    num_steps: int = 1
    num_warmup_steps: int = 1

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.num_warmup_steps < 1:
            raise ValueError(
                f"num_warmup_steps must be >= 1, got {self.num_warmup_steps}. "
                "At least 1 warmup step is required for DDP static_graph compatibility."
            )
        if self.num_steps > 1:
            self.is_enabled = True


class _GAOptimizerWrapper:
    """The optimizer as the pipeline sees it: steps at accumulation boundaries only."""

    def __init__(self, optimizer: torch.optim.Optimizer, config: GradientAccumulationConfig) -> None:
        self._optimizer, self._config = optimizer, config
        self._current_step = 0
        self._needs_zero_grad = True

    def _should_step(self) -> bool:
        return (self._current_step + 1) % self._config.num_steps == 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._needs_zero_grad:
            self._optimizer.zero_grad(set_to_none=set_to_none)
            self._needs_zero_grad = False

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self._should_step():
            self._optimizer.step(*args, **kwargs)
            self._needs_zero_grad = True

    def advance_step(self) -> None:
        self._current_step += 1

    def reset(self) -> None:
        self._current_step = 0
        self._needs_zero_grad = True

    def set_step(self, step: int) -> None:
        self._current_step = step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


In = TypeVar("In")
Out = TypeVar("Out")


class GradientAccumulationWrapper(Generic[In, Out]):
    """``pipeline`` with gradient accumulation over ``model`` (a DMP, DDP or plain module)."""

    def __init__(
        self,
        pipeline: Any,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        config: GradientAccumulationConfig,
    ) -> None:
        self._pipeline, self._model, self._config = pipeline, model, config
        self._optimizer_wrapper = _GAOptimizerWrapper(optimizer, config)
        self._cached_ddp_modules: list[Any] | None = None
        if config.is_enabled:
            # TorchRec's pipelines hold the optimizer as ``_optimizer``, rectrain's as ``optimizer``.
            for attribute in ("_optimizer", "optimizer"):
                if hasattr(pipeline, attribute):
                    setattr(pipeline, attribute, self._optimizer_wrapper)

    def _should_sync_grad(self, is_last_batch: bool = False) -> bool:
        step = self.current_step
        if is_last_batch or step == 0 or step < self._config.num_warmup_steps:
            return True
        return (step + 1) % self._config.num_steps == 0

    def _get_ddp_modules(self) -> list[Any]:
        # The outer wrapper (DMP's wrapped module, or the model) by its no_sync; below it, DDP modules only.
        if self._cached_ddp_modules is None:
            modules: list[Any] = []
            root: Any = self._model
            wrapped = getattr(self._model, "_dmp_wrapped_module", None)
            if isinstance(wrapped, torch.nn.Module):
                root = wrapped
            elif wrapped is not None and hasattr(wrapped, "no_sync"):
                modules.append(wrapped)
            if hasattr(root, "no_sync"):
                modules.append(root)
            if hasattr(root, "modules"):
                modules += [
                    m for m in root.modules() if m is not root and isinstance(m, DistributedDataParallel)
                ]
            self._cached_ddp_modules = modules
        return self._cached_ddp_modules

    @contextlib.contextmanager
    def _get_no_sync_context(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for module in self._get_ddp_modules():
                stack.enter_context(module.no_sync())
            yield

    def _flush_accumulated_gradients(self, steps_accumulated: int) -> bool:
        """Step on what has accumulated since the last step (the data ended mid-accumulation)."""
        if steps_accumulated % self._config.num_steps == 0:
            return False
        self._optimizer_wrapper._optimizer.step()
        self._optimizer_wrapper._optimizer.zero_grad(set_to_none=True)
        self._optimizer_wrapper._needs_zero_grad = False
        return True

    def _advance_state(self) -> None:
        self._optimizer_wrapper.advance_step()

    def progress(self, dataloader_iter: Iterator[Any], is_last_batch: bool | None = None) -> Any:
        """One micro-batch; ``is_last_batch`` (or the data's end) forces a sync and a step."""
        if not self._config.is_enabled:
            return self._pipeline.progress(dataloader_iter)
        sync = self._should_sync_grad(is_last_batch=bool(is_last_batch))
        try:
            with contextlib.nullcontext() if sync else self._get_no_sync_context():
                result = self._pipeline.progress(dataloader_iter)
        except StopIteration:
            self._flush_accumulated_gradients(self.current_step)
            raise
        self._advance_state()
        if is_last_batch:
            self._flush_accumulated_gradients(self.current_step)
        return result

    def reset(self) -> None:
        self._optimizer_wrapper.reset()
        if hasattr(self._pipeline, "reset"):
            self._pipeline.reset()

    @property
    def optimizer_wrapper(self) -> _GAOptimizerWrapper:
        return self._optimizer_wrapper

    @property
    def current_step(self) -> int:
        return self._optimizer_wrapper._current_step

    def set_step(self, step: int) -> None:
        self._optimizer_wrapper.set_step(step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)


__all__ = ["GradientAccumulationConfig", "GradientAccumulationWrapper"]
