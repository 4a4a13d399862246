"""A look at the start of a text data file before anything trains on it or converts it.

A file of the wrong kind reads as nothing but malformed rows, which a non-strict reader skips one warning at
a time until the run has no rows left, or trains on noise. The first ``SNIFF_BYTES`` (decompressed) say
more, and cheaply: gzip data without a ``.gz`` name, binary data (NUL bytes, or bytes that are not UTF-8),
a ``.gz`` file whose stream is damaged at its start, and text none of whose first lines is a row of the
source's format. Each is a ``DataFileError`` naming the file and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rectrain.datasets.line_blocks import open_binary
from rectrain.datasets.rows import GZIP_ERRORS, DataFileError, RowError, check_data_file, gzip_error

SNIFF_BYTES = 1 << 16
SNIFF_LINES = 100
GZIP_MAGIC = b"\x1f\x8b"
_MAX_UNDECODABLE = 0.01  # a text file in another encoding has some; binary data has many


def sniff_text_file(
    path: str | Path, what: str, parse: Callable[[str, str], object] | None = None, kind: str = "data"
) -> None:
    """Raise ``DataFileError`` unless ``path`` starts like a text data file; ``parse(line, path)`` (raising
    ``RowError`` for a line that is not a row) must accept one of its first ``SNIFF_LINES`` lines."""
    path = check_data_file(path, what)
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == GZIP_MAGIC and path.suffix != ".gz":
        raise DataFileError(f"{what} {path} is gzip data not named .gz; rename it to {path.name}.gz")
    try:
        with open_binary(path) as f:
            head = f.read(SNIFF_BYTES)
            complete = len(head) < SNIFF_BYTES
    except GZIP_ERRORS as e:
        raise gzip_error(path, e) from None
    nul = head.find(b"\0")
    if nul >= 0:
        raise DataFileError(
            f"{what} {path} is binary (a NUL byte at offset {nul}), not text; give {kind} text files "
            "(plain or .gz)"
        )
    text = head.decode("utf-8", errors="replace")
    if text.count("\ufffd") > _MAX_UNDECODABLE * max(len(text), 1):
        raise DataFileError(f"{what} {path} is not UTF-8 text (binary data?); give {kind} text files")
    if parse is not None:
        _check_rows(path, what, text, complete, parse, kind)


def _check_rows(
    path: Path, what: str, text: str, complete: bool, parse: Callable[[str, str], object], kind: str
) -> None:
    lines = text.splitlines()
    if not complete:
        lines = lines[:-1]  # the last line may be cut by the sniff
    first_error: tuple[int, RowError] | None = None
    for number, line in enumerate(lines[:SNIFF_LINES], start=1):
        try:
            row = parse(line, str(path))
        except RowError as e:
            first_error = first_error or (number, e)
            continue
        if row is not None:  # None: a header
            return
    if first_error is not None:
        number, error = first_error
        raise DataFileError(
            f"{what} {path}: none of its first {min(len(lines), SNIFF_LINES)} lines is a {kind} row (line "
            f"{number}: column {error.column}: {error}); is it the right file, and data.source its format?"
        )
