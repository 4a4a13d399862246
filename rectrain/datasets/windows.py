"""The global data order of file sources: rows numbered across files, consumed one window per training step.

A file source is one sequence of rows per epoch: its files in order, rows numbered ``0 .. N-1`` across them
(every line counts, a CSV header or a malformed line included, so the numbering never depends on parsing).
A training step of ``W`` ranks with ``B`` rows each consumes the next *window* of ``W * B`` rows, and rank
``r`` takes the ``r``-th contiguous block of it (``rank_block``). The data position of a job is therefore one
number per epoch, the row the next window starts at, whatever the world size: a checkpoint records it
(``DataPosition``) and a resume on any number of ranks starts its windows there, so no row is trained twice
and none is skipped.

Two details keep every row in exactly one window: a remainder of fewer than ``W`` rows at the end of an
epoch joins the window before it (so no rank's block is empty), and a short last window is split evenly
over the ranks. ``drop_last`` instead drops a last window shorter than ``W * B``.

Readers: ``rank_windows`` cuts any stream of numbered rows (text lines, scanned by every reader) into this
rank's blocks; a reader that knows its row count up front (a columnar file with a manifest) can compute the
same windows with ``window_bounds`` and read its block as a row range. A held-out split (``Holdout``) keeps
every ``every``-th block of ``B`` rows out of training; windows are then cut from the rows kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from torch.utils.data import IterableDataset

from rectrain.errors import ConfigError

T = TypeVar("T")

ROWS = "rows"  # DataPosition.offset counts source rows of the epoch (world-size independent)
BATCHES = "batches"  # DataPosition.offset counts batches of each rank's own stream (synthetic data)
UNITS = (ROWS, BATCHES)


@dataclass(frozen=True)
class DataPosition:
    """Where a job's data stream stands: ``offset`` rows of epoch ``epoch`` consumed (``unit="rows"``), or
    ``offset`` batches of every rank's own stream (``unit="batches"``: synthetic data is made per rank).

    ``source`` names the data (``"criteo"``, ``"movielens"``, ``"synthetic"``) so that a resume on other data
    is noticed. ``file`` (a followed directory, ``rectrain.datasets.follow``): the name of the file being
    read; ``offset`` then counts its rows, files whose names sort before it are done, ``epoch`` is unused (0).
    Stored in the checkpoint manifest as ``data_position`` (``file`` only when set).
    """

    epoch: int = 0
    offset: int = 0
    unit: str = ROWS
    source: str = ""
    file: str = ""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ConfigError(f"DataPosition.unit must be one of {UNITS}, got {self.unit!r}")
        for name in ("epoch", "offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"DataPosition.{name} must be a non-negative int, got {value!r}")
        if not isinstance(self.file, str) or "/" in self.file:
            raise ConfigError(f"DataPosition.file must be a file name (no directory), got {self.file!r}")

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        if not self.file:  # the manifests of file and synthetic sources stay as they were
            del record["file"]
        return record

    @classmethod
    def from_dict(cls, data: Any, where: str = "data_position") -> DataPosition:
        """Parse a stored position; ``ConfigError`` naming ``where`` when it is not one."""
        if not isinstance(data, dict) or set(data) - {"epoch", "offset", "unit", "source", "file"}:
            raise ConfigError(f"{where}: expected {{epoch, offset, unit, source[, file]}}, got {data!r:.120}")
        try:
            return cls(**data)
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"{where}: {e}") from None


@dataclass
class Window(Generic[T]):
    """One window as a reader sees it: its own block of numbered rows ``(index, item)`` and the row index
    after the window's last row (the data position once the step that trains it is done)."""

    rows: list[tuple[int, T]]
    end: int


@dataclass
class BatchAt:
    """A rank's batch of one window and the row index after that window (``Window.end``)."""

    batch: Any
    end: int


class Windowed(IterableDataset):
    """``dataset.windows()`` as an ``IterableDataset`` (items ``BatchAt``), for a ``DataLoader``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[BatchAt]:
        return iter(self.dataset.windows())


@dataclass(frozen=True)
class Holdout:
    """Every ``every``-th block of ``block`` rows (counted from row 0 of the epoch) is held out of training;
    ``held_out=True`` selects those blocks (the evaluation split) instead of the others."""

    every: int
    block: int
    held_out: bool = False

    def keeps(self, index: int) -> bool:
        is_held_out = (index // self.block) % self.every == self.every - 1
        return is_held_out == self.held_out


def rank_block(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of ``rank``'s rows in a window of ``size`` rows: near-equal contiguous blocks in rank
    order (exactly ``size / world_size`` rows each when it divides)."""
    return size * rank // world_size, size * (rank + 1) // world_size


def window_bounds(
    start: int, total: int, batch_size: int, world_size: int, *, drop_last: bool = False
) -> Iterator[tuple[int, int]]:
    """``[first, stop)`` row ranges of the windows of rows ``start .. total - 1`` (no held-out split): the
    windows ``rank_windows`` cuts from the same rows, for readers that know their row count."""
    size = batch_size * world_size
    first = start
    while first < total:
        stop = min(first + size, total)
        if drop_last and stop - first < size:
            return
        if not drop_last and 0 < total - stop < world_size:
            stop = total  # a remainder smaller than the world joins this window
        yield first, stop
        first = stop


def rank_windows(
    rows: Iterable[tuple[int, T]],
    batch_size: int,
    rank: int,
    world_size: int,
    *,
    drop_last: bool = False,
    owned: Callable[[int], bool] | None = None,
) -> Iterator[Window[T]]:
    """Cut numbered rows ``(index, item)`` (increasing indices, held-out rows already removed) into windows
    of ``world_size * batch_size`` rows and yield this rank's block of each window ``k`` with ``owned(k)``
    (default: all; DataLoader workers take turns). A reader holds one window's items at a time."""
    size = batch_size * world_size
    source = iter(rows)
    ahead: list[tuple[int, T]] = []
    for k in itertools.count():
        mine = owned is None or owned(k)
        window = list(itertools.islice(itertools.chain(ahead, source), size))
        if not window:
            return
        ahead = list(itertools.islice(source, world_size)) if len(window) == size else []
        if len(window) < size and drop_last:
            return
        last_window = len(window) < size or (len(ahead) < world_size and not drop_last)
        if last_window:
            window += ahead
            ahead = []
        if mine:
            lo, hi = rank_block(len(window), rank, world_size)
            yield Window(window[lo:hi], window[-1][0] + 1)
        if last_window:
            return
