"""``MetricStates``: named metric states that reset, checkpoint and combine across ranks.

The part of ``torchmetrics.Metric`` that TorchRec's metrics stand on, without the dependency: a state is a
tensor (a running sum) or a list of tensors (AUC's buffered examples), registered with ``add_state`` and a
reduction that says how the ranks' copies combine. ``sync`` replaces every state by the reduction over the
ranks of the process group (a collective) and ``unsync`` puts the local states back, so a computation can
read global values and keep accumulating locally. A ``WindowBuffer`` keeps the latest batches'
contributions to a windowed sum.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

#: A window keeps at most this many batches' contributions (TorchRec's bound).
MAX_BUFFER_COUNT = 1000

Reduction = str | Callable[[Any], Any] | None

_REDUCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "sum": lambda x: torch.sum(x, dim=0),
    "mean": lambda x: torch.mean(x, dim=0),
    "max": lambda x: torch.max(x, dim=0).values,
    "min": lambda x: torch.min(x, dim=0).values,
    "cat": lambda x: x if isinstance(x, Tensor) else torch.cat(x),
}


class MetricStates(nn.Module):
    """States of one metric computation, with their defaults, reductions and persistence."""

    def __init__(self, process_group: dist.ProcessGroup | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.process_group = process_group
        self._defaults: dict[str, Tensor | list] = {}
        self._persistent: dict[str, bool] = {}
        self._reductions: dict[str, Reduction] = {}
        self._local: dict[str, Any] | None = None
        self._device = torch.device("cpu")

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def _is_synced(self) -> bool:
        return self._local is not None

    def add_state(
        self, name: str, default: Tensor | list, dist_reduce_fx: Reduction = None, persistent: bool = False
    ) -> None:
        """Register ``name`` (a tensor, or ``[]`` for a list of tensors); ``reset`` restores ``default``."""
        if not isinstance(default, Tensor) and default != []:
            raise ValueError(f"state {name!r}: default must be a tensor or an empty list, got {default!r}")
        if isinstance(dist_reduce_fx, str) and dist_reduce_fx not in _REDUCTIONS:
            raise ValueError(
                f"state {name!r}: dist_reduce_fx must be one of {sorted(_REDUCTIONS)} or a callable"
            )
        self._defaults[name] = default.detach().clone() if isinstance(default, Tensor) else []
        self._persistent[name] = persistent
        self._reductions[name] = _REDUCTIONS.get(dist_reduce_fx, dist_reduce_fx)
        setattr(self, name, self._fresh(name))

    def _fresh(self, name: str) -> Tensor | list:
        default = self._defaults[name]
        return default.detach().clone().to(self._device) if isinstance(default, Tensor) else []

    def reset(self) -> None:
        """Every state back to its default (and any synced copy forgotten)."""
        self._local = None
        for name in self._defaults:
            setattr(self, name, self._fresh(name))

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> nn.Module:
        super()._apply(fn, *args, **kwargs)
        for name in self._defaults:
            value = getattr(self, name)
            setattr(self, name, [fn(v) for v in value] if isinstance(value, list) else fn(value))
        self._device = fn(torch.zeros(0, device=self._device)).device
        return self

    def sync(self, process_group: dist.ProcessGroup | None = None) -> None:
        """Replace each state by its reduction over the ranks (collective; a no-op in one process)."""
        group = process_group or self.process_group
        if self._local is not None or not _distributed(group):
            return
        self._local = {name: getattr(self, name) for name in self._defaults}
        for name, reduce in self._reductions.items():
            value = self._local[name]
            if isinstance(value, list):
                gathered = _gather(torch.cat(value, dim=-1), group) if value else []
            else:
                gathered = torch.stack(_gather(value, group))
            setattr(self, name, gathered if reduce is None else reduce(gathered))

    def unsync(self) -> None:
        """Put back the local states that ``sync`` replaced."""
        if self._local is None:
            raise RuntimeError(f"{type(self).__name__}.unsync() called without a sync()")
        for name, value in self._local.items():
            setattr(self, name, value)
        self._local = None

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, persistent in self._persistent.items():
            value = getattr(self, name)
            if persistent and isinstance(value, Tensor):
                destination[prefix + name] = value if keep_vars else value.detach()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        for name, persistent in self._persistent.items():
            if persistent and prefix + name in state_dict:
                setattr(self, name, state_dict.pop(prefix + name).to(self._device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class WindowBuffer:
    """The latest batches' contributions to a window state: adding one drops the oldest while the window
    holds more than ``max_size`` examples (so it holds whole batches, at most ``max_size`` examples)."""

    def __init__(self, max_size: int, max_buffer_count: int) -> None:
        self._max_size = max_size
        self._max_buffer_count = max_buffer_count
        self._buffers: deque[Tensor] = deque(maxlen=max_buffer_count)
        self._used_sizes: deque[int] = deque(maxlen=max_buffer_count)
        self._window_used_size = 0

    def aggregate_state(self, window_state: Tensor, curr_state: Tensor, size: int) -> None:
        """Add ``curr_state`` (a batch of ``size`` examples) to ``window_state`` in place; drop the oldest."""
        if len(self._buffers) == self._buffers.maxlen:
            self._drop_oldest(window_state)
        self._buffers.append(curr_state.clone())
        self._used_sizes.append(size)
        window_state += curr_state
        self._window_used_size += size
        while self._window_used_size > self._max_size:
            self._drop_oldest(window_state)

    def _drop_oldest(self, window_state: Tensor) -> None:
        window_state -= self._buffers.popleft()
        self._window_used_size -= self._used_sizes.popleft()

    @property
    def buffers(self) -> deque[Tensor]:
        return self._buffers


def _distributed(group: dist.ProcessGroup | None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _gather(tensor: Tensor, group: dist.ProcessGroup | None) -> list[Tensor]:
    """Every rank's ``tensor`` in rank order; shapes may differ between ranks (padded for the collective).
    It travels on the device the group's backend needs (gloo: CPU, NCCL: the current GPU)."""
    from rectrain.distributed.comm.autograd import comm_device

    device = tensor.device
    tensor = tensor.to(comm_device(group))
    return [t.to(device) for t in _gather_on(tensor, group)]


def _gather_on(tensor: Tensor, group: dist.ProcessGroup | None) -> list[Tensor]:
    world = dist.get_world_size(group)
    shape = torch.tensor(tensor.shape, device=tensor.device)
    shapes = [torch.zeros_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape, group=group)
    if all(bool((s == shape).all()) for s in shapes):
        out = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(out, tensor.contiguous(), group=group)
        return out
    largest = torch.stack(shapes).max(dim=0).values.tolist()
    padded = tensor.new_zeros(largest)
    padded[tuple(slice(0, n) for n in tensor.shape)] = tensor
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [t[tuple(slice(0, int(n)) for n in s.tolist())] for t, s in zip(out, shapes)]
