"""Text files as numbered rows cut into global windows: the reading side shared by the Criteo and MovieLens
datasets.

``text_windows`` streams the files line by line (plain or gzip, never loaded whole), numbers every line
across the files but a header (the row index of ``windows``; a malformed line is a row too, so the numbering
never depends on parsing), drops rows before the start position and those the held-out
split does not select, cuts the rest into windows (``rank_windows``; DataLoader workers take turns) and
parses this rank's block of each window. Every reader still reads every line: gzip cannot be split by byte
range, and a line's window is only known by counting.

The malformed-row policy (``RowParser``, through ``rows.RowPolicy``): a parser raises ``RowError(column,
message)`` for a bad row; the policy then either raises ``MalformedRowError`` naming file, line (1-based) and
column (``strict=True``) or logs a warning, counts the row in ``RowStats`` and skips it. A parser may return
``None`` for a row to pass over silently.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from torch.utils.data import IterableDataset

from rectrain.datasets.rows import GZIP_ERRORS, RowError, RowPolicy, RowStats, gzip_error, open_text
from rectrain.datasets.sharding import ShardInfo, check_rank, worker_shard
from rectrain.datasets.windows import BatchAt, Holdout, Window, rank_windows
from rectrain.models.batch import Batch

logger = logging.getLogger(__name__)

T = TypeVar("T")


def numbered_lines(
    paths: Sequence[str], starts: list[tuple[int, int]], is_header: Callable[[str, str], bool] | None = None
) -> Iterator[tuple[int, str]]:
    """Every data line of ``paths`` in order as ``(row index across the files, text without its line end)``.

    A file's first line is not a row when ``is_header(text, path)`` says so. When a file is opened,
    ``(its first row index, that row's 1-based line number)`` is appended to ``starts``.
    """
    index = 0
    for path in paths:
        with open_text(path) as f:
            lines = _checked_lines(f, path)
            first = next(lines, None)
            if first is None:
                starts.append((index, 1))
                continue
            first = first.rstrip("\r\n")
            header = is_header is not None and is_header(first, str(path))
            starts.append((index, 2 if header else 1))
            if not header:
                yield index, first
                index += 1
            for line in lines:
                yield index, line.rstrip("\r\n")
                index += 1


def _checked_lines(f: Iterable[str], path: str) -> Iterator[str]:
    """The lines of ``f``; a damaged gzip stream is a ``DataFileError`` naming ``path``."""
    try:
        yield from f
    except GZIP_ERRORS as e:
        raise gzip_error(path, e) from None


class RowParser(Generic[T]):
    """Parses numbered lines under the malformed-row policy; finds a row's file and line from ``starts``."""

    def __init__(
        self,
        paths: Sequence[str],
        starts: list[tuple[int, int]],
        parse: Callable[[str, str], T | None],
        stats: RowStats,
        *,
        strict: bool,
    ) -> None:
        self.paths, self.starts, self.parse, self.stats = paths, starts, parse, stats
        self.policy = RowPolicy(stats, strict)

    def where(self, index: int) -> tuple[str, int]:
        """(file, 1-based line) of row ``index``."""
        file = bisect.bisect_right(self.starts, (index, float("inf"))) - 1
        first_index, first_line = self.starts[file]
        return str(self.paths[file]), index - first_index + first_line

    def __call__(self, index: int, text: str) -> T | None:
        path, line = self.where(index)
        try:
            row = self.parse(text, path)
        except RowError as e:
            self.policy.bad_row(path, line, e)
            return None
        if row is not None:
            self.stats.rows_read += 1
        return row


def text_windows(
    paths: Sequence[str],
    parse: Callable[[str, str], T | None],
    stats: RowStats,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    start_row: int = 0,
    select: Holdout | None = None,
    drop_last: bool = False,
    strict: bool = False,
    is_header: Callable[[str, str], bool] | None = None,
) -> Iterator[Window[T]]:
    """This rank's (and DataLoader worker's) parsed rows of each window of ``paths``, from ``start_row``;
    ``parse(text, path)`` turns one line into a row (see ``RowParser``), ``is_header`` spots a file's header
    line, which is not a row."""
    worker = worker_shard(rank, world_size)
    starts: list[tuple[int, int]] = []
    parser = RowParser(paths, starts, parse, stats, strict=strict)
    rows = (
        (i, text)
        for i, text in numbered_lines(paths, starts, is_header)
        if i >= start_row and (select is None or select.keeps(i))
    )
    for window in rank_windows(rows, batch_size, rank, world_size, drop_last=drop_last, owned=worker.owns):
        parsed = [(i, row) for i, text in window.rows if (row := parser(i, text)) is not None]
        yield Window(parsed, window.end)
    log_skipped(stats, rank, worker)


def log_skipped(stats: RowStats, rank: int, worker: ShardInfo) -> None:
    """At the end of a pass, one INFO line with the reader's counts when it skipped rows."""
    if stats.rows_skipped:
        logger.info(
            "rank %d, reader %d/%d: %d rows read, %d skipped (by column: %s)",
            rank,
            worker.index,
            worker.num_shards,
            stats.rows_read,
            stats.rows_skipped,
            dict(stats.skipped_by_column),
        )


class TextDataset(IterableDataset, Generic[T]):
    """A dataset of text files read in global windows: this rank's and DataLoader worker's block of every
    window (see ``windows``), from row ``start_row`` on, of the rows ``select`` keeps (default: all).

    Use ``DataLoader(dataset, batch_size=None, num_workers=N)``: workers take turns by window, so the batches
    are the same whatever ``N``. ``windows()`` also gives each batch's data position. ``stats`` counts rows
    read and skipped in this process. A subclass parses a line (``parse_line``), builds a batch from parsed
    rows (``make_batch``) and may spot header lines (``is_header``); ``config`` has ``paths``,
    ``batch_size``, ``drop_last`` and ``strict``.
    """

    is_header: Callable[[str, str], bool] | None = None

    def __init__(
        self,
        config: Any,
        rank: int = 0,
        world_size: int = 1,
        *,
        start_row: int = 0,
        select: Holdout | None = None,
    ) -> None:
        check_rank(rank, world_size)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.start_row, self.select = start_row, select
        self.stats = RowStats()

    def parse_line(self, line: str, path: str) -> T | None:
        raise NotImplementedError

    def make_batch(self, rows: list[T]) -> Batch:
        raise NotImplementedError

    def windows(self) -> Iterator[BatchAt]:
        """This reader's batch of each window it owns, with the row index after the window."""
        cfg = self.config
        for window in text_windows(
            cfg.paths,
            self.parse_line,
            self.stats,
            batch_size=cfg.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            start_row=self.start_row,
            select=self.select,
            drop_last=cfg.drop_last,
            strict=cfg.strict,
            is_header=type(self).is_header,
        ):
            yield BatchAt(self.make_batch([row for _, row in window.rows]), window.end)

    def __iter__(self) -> Iterator[Batch]:
        return (item.batch for item in self.windows())
