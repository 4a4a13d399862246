"""The pieces every file dataset shares: row errors, integer parsing, row counters, opening text files.

A parser raises ``RowError(column, message)`` for a bad row; ``RowPolicy`` applies the malformed-row policy
(raise ``MalformedRowError`` naming file, line and column, or warn, count and skip) for every text reader,
line by line (``lines``) or vectorised (``criteo_columns``).
"""

from __future__ import annotations

import gzip
import io
import logging
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rectrain.errors import RecTrainError

logger = logging.getLogger(__name__)

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


class DataFileError(RecTrainError, FileNotFoundError):
    """A data file is missing or is not a file; names it and the fix."""


def check_data_file(path: str | Path, what: str = "data file") -> Path:
    """``path`` if it is a readable file, else ``DataFileError`` naming it and what to do."""
    path = Path(path)
    if path.is_dir():
        example = path / "part-0.tsv"
        raise DataFileError(f"{what} {path} is a directory; list the files inside it (e.g. {example})")
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise DataFileError(f"{what} {path} does not exist{where}; fix the path")
    return path


# What a damaged gzip stream raises while it is read (a truncated file: EOFError at its end).
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def gzip_error(path: str | Path, error: Exception) -> DataFileError:
    """The one-line error of a gzip stream that breaks while it is read."""
    what = "ends early (truncated)" if isinstance(error, EOFError) else f"is damaged ({error})"
    return DataFileError(f"{path}: the gzip stream {what}; download or compress the file again")


def open_text(path: str | Path) -> io.TextIOBase:
    """Open ``path`` for text reading; ``.gz`` files are decompressed as they stream."""
    path = check_data_file(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


class RowPolicy:
    """The malformed-row policy of one reader: raise (``strict``) or warn, count and skip.

    Per file, warnings go out for the first ``MAX_WARNINGS_PER_FILE`` skipped rows, then one line says the
    rest are only counted.
    """

    def __init__(self, stats: RowStats, strict: bool) -> None:
        self.stats, self.strict = stats, strict
        self._warned: Counter[str] = Counter()

    def bad_row(self, path: str, line: int, error: RowError) -> None:
        """Line ``line`` (1-based) of ``path`` is malformed: raise ``MalformedRowError`` or count and warn."""
        if self.strict:
            raise MalformedRowError(path, line, error.column, str(error)) from None
        self.stats.skip(error.column)
        self._warned[path] += 1
        if self._warned[path] <= MAX_WARNINGS_PER_FILE:
            logger.warning("skipping %s:%d: column %s: %s", path, line, error.column, error)
        if self._warned[path] == MAX_WARNINGS_PER_FILE:
            logger.warning("%s: further skipped rows are counted without a warning each", path)
