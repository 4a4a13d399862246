"""Keeping the ranks in step: every rank trains the same number of batches and stops at the same step.

File sources can give ranks a different number of batches (a rank's share of the lines), and torchrun sends
SIGTERM to each rank at its own moment. A rank that stops alone leaves its peers waiting in a collective
forever, so before each batch the ranks agree, in one tiny all-reduce on a side gloo group, on "every rank
has a batch", "some rank was asked to stop" and "some rank failed to read its batch", and count the rows of
the step (the examples trained, exact even when ranks' batches differ in size). Every rank fetches its
batches in the same order (the pipelines do), so the agreed flags change at the same step everywhere.

A followed directory (``rectrain.datasets.follow``) adds two things to the same all-reduce. A rank whose
stream is waiting for the next file says so; then no rank trains: the ranks that have a batch hold it and
every rank agrees again (the waiting rank after its next poll), so a stop or a failure is agreed while
waiting too and no rank sits in a collective longer than one poll. And each rank contributes a key of its
data position (file and row), so ranks that would train different files at one step (a file renamed in
out of name order, or seen by one host before another) fail together instead of training inconsistent data.
"""

from __future__ import annotations

import logging
import signal
import threading
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from rectrain.datasets.follow import Waiting
from rectrain.datasets.windows import DataPosition
from rectrain.distributed import ShardingEnv
from rectrain.distributed.comm.timeouts import collective, new_group
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
    someone_waits: bool = False
    keys_differ: bool = False


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
        self,
        has_batch: bool,
        stop: bool,
        failed: bool = False,
        rows: int = 0,
        empty: bool = False,
        waiting: bool = False,
        key: int | None = None,
    ) -> Agreed:
        """Every rank's flags and row count combined (collective). ``key`` (the same on every rank, or None
        on every rank): a number every rank must agree on, checked when no rank waits."""
        failing = [0] * self._world_size
        failing[self._rank] = int(failed)
        keys = [] if key is None else [0] * self._world_size
        if key is not None:
            keys[self._rank] = key
        flags = [int(not has_batch), int(stop), int(empty), rows, int(waiting), *failing, *keys]
        missing, stopping, emptied, total_rows, waits, *by_rank = self._sum(flags, "batch agreement")
        failed_ranks = tuple(r for r, f in enumerate(by_rank[: self._world_size]) if f)
        differ = len(set(by_rank[self._world_size :])) > 1
        return Agreed(missing == 0, stopping > 0, failed_ranks, total_rows, emptied > 0, waits > 0, differ)

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
    rows all ranks trained in that step and the data position after it, and ``WAITING`` (a followed
    directory without a new file): no rank trains until no rank waits. ``keyed``: check every step that the
    ranks' positions agree (followed data, where each rank picks its next file itself). A rank that fails
    to read its next batch raises its error, and every other rank raises ``DataReadError`` at the same step
    (``failed``).
    """

    def __init__(
        self,
        batches: Iterator[Batch | PositionedBatch],
        agreement: RankAgreement,
        stop: StopSignal | None = None,
        *,
        keyed: bool = False,
    ) -> None:
        self._batches, self._agreement, self._stop = batches, agreement, stop
        self._keyed = keyed  # every rank alike: the ranks check that they train the same positions
        self.stop_agreed = False
        self.failed = False
        self._ended = False
        self._fetched: deque[tuple[int, DataPosition | None]] = deque()
        self._held: Batch | PositionedBatch | None = None  # a batch kept while a peer waits for data

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
        item, self._held = self._held, None
        if item is None:
            try:
                item = next(self._batches, None)
            except Exception as e:  # agreed below, so that no rank is left waiting in the next collective
                item, error = None, e
        waiting = isinstance(item, Waiting)
        batch, position = (item.batch, item.position) if isinstance(item, PositionedBatch) else (item, None)
        batch = None if waiting else batch
        wants_stop = self._stop is not None and self._stop.requested
        rows = 0 if batch is None else int(batch.labels.shape[0])
        empty = batch is not None and rows == 0
        has = batch is not None or waiting
        key = _position_key(position) if self._keyed else None
        agreed = self._agreement.agree(has, wants_stop, error is not None, rows, empty, waiting, key)
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
        if agreed.someone_waits:  # nobody trains; try again (a stop ends the run, the held batch untrained)
            self._held = None if waiting else item
            if self.stop_agreed:
                self._ended = True
                raise StopIteration
            return None
        if agreed.keys_differ:
            self._ended = self.failed = True
            raise DataReadError(
                f"the ranks would train different files or rows at this step (this rank: {position}): a "
                "file was renamed into the followed directory out of name order, or is not yet visible on "
                "every host"
            )
        if agreed.someone_empty:  # all its rows were malformed: a step of no rows would make the loss NaN
            logger.warning("a rank's batch has no valid rows; all skip this step (%d rows)", agreed.rows)
            return None
        self._fetched.append((agreed.rows, position))
        return batch

    def trained(self) -> tuple[int, DataPosition | None]:
        """(rows trained by all ranks, data position after them) of the oldest batch not yet accounted for."""
        return self._fetched.popleft()


def _position_key(position: DataPosition | None) -> int:
    """A number naming a data position (file and row), equal on every rank that reads the same window."""
    if position is None:
        return 0
    return zlib.crc32(f"{position.file}:{position.offset}".encode()) + 1
