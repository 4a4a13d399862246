"""Keeping the ranks in step: every rank trains the same number of batches and stops at the same step.

File sources can give ranks a different number of batches (a rank's share of the lines), and torchrun sends
SIGTERM to each rank at its own moment. A rank that stops alone leaves its peers waiting in a collective
forever, so before each batch the ranks agree, in one tiny all-reduce on a side gloo group, on two flags:
"every rank has a batch" and "some rank was asked to stop". Every rank fetches its batches in the same
order (the pipelines do), so the agreed flags change at the same step everywhere.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from rectrain.distributed import ShardingEnv
from rectrain.models.batch import Batch


class StopSignal:
    """While entered, SIGTERM (and SIGINT) only set ``requested``; the loop stops at the next step boundary.

    Handlers can only be installed from the main thread; elsewhere this never fires.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self.signals = signals
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


class RankAgreement:
    """One all-reduce per call over a side gloo group (a no-op without a process group)."""

    def __init__(self, env: ShardingEnv | None) -> None:
        distributed = env is not None and env.pg is not None and env.world_size > 1
        self._group = dist.new_group(backend="gloo") if distributed else None

    def agree(self, has_batch: bool, stop: bool) -> tuple[bool, bool]:
        """(every rank has a batch, some rank wants to stop)."""
        if self._group is None:
            return has_batch, stop
        flags = torch.tensor([0 if has_batch else 1, 1 if stop else 0], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
        return flags[0].item() == 0, flags[1].item() == 1

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on some rank."""
        if self._group is None:
            return flag
        flags = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
        return flags.item() == 1


class AgreedBatches(Iterator[Batch]):
    """``batches`` that end on every rank as soon as one rank's end; ``stop_agreed`` once any rank stops."""

    def __init__(
        self, batches: Iterator[Batch], agreement: RankAgreement, stop: StopSignal | None = None
    ) -> None:
        self._batches, self._agreement, self._stop = batches, agreement, stop
        self.stop_agreed = False
        self._ended = False

    def __next__(self) -> Batch:
        if self._ended:
            raise StopIteration
        batch = next(self._batches, None)
        wants_stop = self._stop is not None and self._stop.requested
        everyone_has, someone_stops = self._agreement.agree(batch is not None, wants_stop)
        self.stop_agreed = self.stop_agreed or someone_stops
        if not everyone_has:
            self._ended = True
            raise StopIteration
        return batch
