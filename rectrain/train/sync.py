"""Keeping the ranks in step: every rank trains the same number of batches and stops at the same step.

File sources can give ranks a different number of batches (a rank's share of the lines), and torchrun sends
SIGTERM to each rank at its own moment. A rank that stops alone leaves its peers waiting in a collective
forever, so before each batch the ranks agree, in one tiny all-reduce on a side gloo group, on "every rank
has a batch", "some rank was asked to stop" and "some rank failed to read its batch", and count the rows of
the step (the examples trained, exact even when ranks' batches differ in size). Every rank fetches its
batches in the same order (the pipelines do), so the agreed flags change at the same step everywhere.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from rectrain.datasets.windows import DataPosition
from rectrain.distributed import ShardingEnv
from rectrain.distributed.timeouts import collective, new_group
from rectrain.errors import RecTrainError
from rectrain.models.batch import Batch
from rectrain.train.data import PositionedBatch

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Agreed:
    """What the ranks agreed on before a step: every rank has a batch, some rank stops, the ranks that
    failed to read their batch, the rows of all ranks' batches together, and whether some batch is empty."""

    everyone_has: bool
    someone_stops: bool
    failed_ranks: tuple[int, ...]
    rows: int
    someone_empty: bool = False


class RankAgreement:
    """One all-reduce per call over a side gloo group (a no-op without a process group)."""

    def __init__(self, env: ShardingEnv | None) -> None:
        distributed = env is not None and env.pg is not None and env.world_size > 1
        self._group = new_group(backend="gloo") if distributed else None
        self._rank = env.rank if env is not None else 0
        self._world_size = env.world_size if env is not None else 1

    def _sum(self, values: list[int], what: str) -> list[int]:
        if self._group is None:
            return values
        tensor = torch.tensor(values, dtype=torch.int64)
        with collective(f"all_reduce ({what})", self._group):
            dist.all_reduce(tensor, group=self._group)
        return tensor.tolist()

    def agree(
        self, has_batch: bool, stop: bool, failed: bool = False, rows: int = 0, empty: bool = False
    ) -> Agreed:
        """Every rank's flags and row count combined (collective)."""
        failing = [0] * self._world_size
        failing[self._rank] = int(failed)
        missing, stopping, emptied, total_rows, *failed_by_rank = self._sum(
            [int(not has_batch), int(stop), int(empty), rows, *failing], "batch agreement"
        )
        failed_ranks = tuple(r for r, f in enumerate(failed_by_rank) if f)
        return Agreed(missing == 0, stopping > 0, failed_ranks, total_rows, emptied > 0)

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on some rank."""
        return self._sum([int(flag)], "flag agreement")[0] > 0

    def most(self, value: int) -> int:
        """The largest of every rank's ``value``."""
        values = [0] * self._world_size
        values[self._rank] = value
        return max(self._sum(values, "max agreement"))


class DataReadError(RecTrainError):
    """Another rank failed to read its next batch; every rank stops at the same step (see that rank's log)."""


class AgreedBatches(Iterator[Batch]):
    """``batches`` that end on every rank as soon as one rank's end; ``stop_agreed`` once any rank stops.

    Items may be ``PositionedBatch``es: then ``trained()``, called once per trained step in order, gives the
    rows all ranks trained in that step and the data position after it. A rank that fails to read its next
    batch raises its error, and every other rank raises ``DataReadError`` at the same step (``failed``).
    """

    def __init__(
        self,
        batches: Iterator[Batch | PositionedBatch],
        agreement: RankAgreement,
        stop: StopSignal | None = None,
    ) -> None:
        self._batches, self._agreement, self._stop = batches, agreement, stop
        self.stop_agreed = False
        self.failed = False
        self._ended = False
        self._fetched: deque[tuple[int, DataPosition | None]] = deque()

    def __next__(self) -> Batch:
        while True:
            if self._ended:
                raise StopIteration
            batch = self._next_agreed()
            if batch is not None:
                return batch

    def _next_agreed(self) -> Batch | None:
        """The next batch, or None for a step that every rank skips (some rank's batch has no rows)."""
        error: Exception | None = None
        try:
            item = next(self._batches, None)
        except Exception as e:  # agreed below, so that no rank is left waiting in the next collective
            item, error = None, e
        batch, position = (item.batch, item.position) if isinstance(item, PositionedBatch) else (item, None)
        wants_stop = self._stop is not None and self._stop.requested
        rows = 0 if batch is None else int(batch.labels.shape[0])
        empty = batch is not None and rows == 0
        agreed = self._agreement.agree(batch is not None, wants_stop, error is not None, rows, empty)
        self.stop_agreed = self.stop_agreed or agreed.someone_stops
        if agreed.failed_ranks:
            self._ended = self.failed = True
            if error is not None:
                raise error
            ranks = ", ".join(map(str, agreed.failed_ranks))
            raise DataReadError(f"rank {ranks} failed to read its next batch (see its error); stopping too")
        if not agreed.everyone_has:
            self._ended = True
            raise StopIteration
        if agreed.someone_empty:  # all its rows were malformed: a step of no rows would make the loss NaN
            logger.warning("a rank's batch has no valid rows; all skip this step (%d rows)", agreed.rows)
            return None
        self._fetched.append((agreed.rows, position))
        return batch

    def trained(self) -> tuple[int, DataPosition | None]:
        """(rows trained by all ranks, data position after them) of the oldest batch not yet accounted for."""
        return self._fetched.popleft()
