"""Streaming text rows of one shard, with the malformed-row policy shared by every file dataset.

``iter_rows`` opens a plain or gzip (``.gz``) file, streams it line by line (never loads it whole), keeps
the lines this shard owns (every ``num_shards``-th line, counted from 0 over the whole file, header
included) and hands each to a parser. A parser raises ``RowError(column, message)`` for a bad row; the
policy then either raises ``MalformedRowError`` naming file, line (1-based) and column (``strict=True``) or
logs a warning, counts the row in ``RowStats`` and skips it. Every reader still decompresses the whole file;
that is the price of gzip, which cannot be split by byte range.
"""

from __future__ import annotations

import gzip
import io
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rectrain.datasets.sharding import ShardInfo
from rectrain.errors import RecTrainError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Per file and reader, warnings for the first this many skipped rows; then one line that says so.
MAX_WARNINGS_PER_FILE = 20

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_TABLE_ROWS = 2**62  # a table size from a config: ids must fit int64 tensors and FBGEMM's row arithmetic
# ASCII digits only: Python's int() also takes "1_000", non-ASCII digits and 4,000-digit strings.
_INTEGER = re.compile(r"[-+]?[0-9]{1,40}")


class MalformedRowError(RecTrainError, ValueError):
    """A row of a data file could not be parsed (``strict=True``); names file, line and column."""

    def __init__(self, path: str, line: int, column: int | str, message: str) -> None:
        super().__init__(f"{path}:{line}: column {column}: {message}")
        self.path, self.line, self.column = path, line, column


class RowError(ValueError):
    """Raised by a row parser: ``column`` (1-based index or name) and what is wrong with it."""

    def __init__(self, column: int | str, message: str) -> None:
        super().__init__(message)
        self.column = column


def parse_int(text: str, column: int | str, what: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """``text`` (surrounding spaces allowed) as an int in ``[low, high]``, else ``RowError`` naming ``what``.

    Every integer read from a data file goes through here, so none can overflow an int64 tensor or
    become an out-of-range id later.
    """
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise RowError(column, f"{what} is not an integer: {text[:40]!r}{'...' if len(text) > 40 else ''}")
    value = int(stripped)
    if value < low:
        raise RowError(column, f"{what} is negative: {text!r}" if low == 0 else f"{what} {value} < {low}")
    if value > high:
        raise RowError(column, f"{what} {value} is larger than {high}")
    return value


@dataclass
class RowStats:
    """Rows this reader parsed and skipped, skips by reason (the ``RowError`` message's first words).

    Counts live in the process that reads: with DataLoader workers each worker has its own copy, and a
    summary is logged at INFO when each file ends.
    """

    rows_read: int = 0
    rows_skipped: int = 0
    skipped_by_column: Counter = field(default_factory=Counter)

    def skip(self, column: int | str) -> None:
        self.rows_skipped += 1
        self.skipped_by_column[column] += 1


def open_text(path: str | Path) -> io.TextIOBase:
    """Open ``path`` for text reading; ``.gz`` files are decompressed as they stream."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist or is not a file")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


class RowPolicy:
    """The malformed-row policy for one file and reader: raise (``strict``) or warn, count and skip.

    Warnings go out for the first ``MAX_WARNINGS_PER_FILE`` skipped rows, then one line says the rest are
    only counted. Every reader of text rows (line by line or vectorised) reports through this.
    """

    def __init__(self, path: str | Path, stats: RowStats, strict: bool) -> None:
        self.path, self.stats, self.strict = path, stats, strict
        self.warned = 0

    def bad_row(self, line: int, error: RowError) -> None:
        """Line ``line`` (1-based) is malformed: raise ``MalformedRowError`` or count and warn."""
        if self.strict:
            raise MalformedRowError(str(self.path), line, error.column, str(error)) from None
        self.stats.skip(error.column)
        self.warned += 1
        if self.warned <= MAX_WARNINGS_PER_FILE:
            logger.warning("skipping %s:%d: column %s: %s", self.path, line, error.column, error)
        if self.warned == MAX_WARNINGS_PER_FILE:
            logger.warning("%s: further skipped rows are counted without a warning each", self.path)

    def file_done(self, shard: ShardInfo | None = None) -> None:
        """Log the reader's counts when the file had skipped rows."""
        stats = self.stats
        if stats.rows_skipped:
            where = "" if shard is None else f" (shard {shard.index}/{shard.num_shards})"
            logger.info(
                "%s%s: %d rows read, %d skipped so far (by column: %s)",
                self.path,
                where,
                stats.rows_read,
                stats.rows_skipped,
                dict(stats.skipped_by_column),
            )


def iter_rows(
    path: str | Path,
    parse: Callable[[str], T | None],
    shard: ShardInfo,
    stats: RowStats,
    *,
    strict: bool = False,
) -> Iterator[T]:
    """Parsed rows of ``path`` owned by ``shard``; ``parse`` returns ``None`` for a row to pass over silently
    (a header), raises ``RowError`` for a malformed one."""
    policy = RowPolicy(path, stats, strict)
    with open_text(path) as f:
        for index, line in enumerate(f):
            if not shard.owns(index):
                continue
            try:
                row = parse(line.rstrip("\r\n"))
            except RowError as e:
                policy.bad_row(index + 1, e)
                continue
            if row is not None:
                stats.rows_read += 1
                yield row
    policy.file_done(shard)


def batched(rows: Iterator[T], batch_size: int, drop_last: bool) -> Iterator[list[T]]:
    """Group ``rows`` into lists of ``batch_size``; the last short list is kept unless ``drop_last``."""
    chunk: list[T] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == batch_size:
            yield chunk
            chunk = []
    if chunk and not drop_last:
        yield chunk
