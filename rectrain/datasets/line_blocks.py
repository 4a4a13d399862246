"""A text file as blocks of whole lines in a NumPy byte buffer, split exactly as Python's text mode splits.

The line-by-line readers open files with ``newline=""``: a line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r``,
and the terminator is stripped. ``iter_line_blocks`` reads large binary blocks (plain or gzip), cuts them
after the last complete line and reports every line's byte range and 0-based number, so vectorised parsers
see the same lines, numbered the same way, at a fraction of the cost. A line a vectorised parser cannot take
is decoded with ``line_text`` exactly as the text reader decodes it (UTF-8, invalid bytes replaced).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from rectrain.datasets.rows import GZIP_ERRORS, check_data_file, gzip_error

#: Bytes before the first line in ``LineBlock.buf``: a parser may read up to 16 bytes before a field.
PAD = 16
_TAIL = 8  # and up to 8 bytes past the end of the data
_LF, _CR = 10, 13
DEFAULT_BLOCK_BYTES = 1 << 20  # measured: 1 MiB blocks parse faster than 4 MiB ones (cache)


def open_binary(path: str | Path) -> BinaryIO:
    """Open ``path`` for binary reading; ``.gz`` files are decompressed as they stream."""
    path = check_data_file(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


@dataclass
class LineBlock:
    """Whole lines: line ``i`` (number ``first_line + i``) is ``buf[starts[i]:ends[i]]``, terminator removed.

    ``buf`` has ``PAD`` bytes of ``b"0"`` before the data and 8 zero bytes after it.
    """

    buf: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    first_line: int

    def __len__(self) -> int:
        return len(self.starts)

    def line_text(self, i: int) -> str:
        """Line ``i`` decoded as the text readers decode it."""
        return self.buf[self.starts[i] : self.ends[i]].tobytes().decode("utf-8", errors="replace")


def _cut(data: bytes | bytearray, at_eof: bool) -> int:
    """Bytes of ``data`` that hold complete lines (all of it at the end of the file)."""
    if at_eof:
        return len(data)
    lf = data.rfind(b"\n")
    cr = data.rfind(b"\r", 0, len(data) - 1)  # a final \r may be the first half of \r\n
    return max(lf, cr) + 1


def split_lines(data: bytes | bytearray, first_line: int) -> LineBlock:
    """The lines of ``data`` (complete lines; a last line without terminator counts)."""
    buf = np.frombuffer(b"0" * PAD + bytes(data) + b"\0" * _TAIL, np.uint8)
    body = buf[PAD : PAD + len(data)]
    lf = np.flatnonzero(body == _LF)
    cr = np.flatnonzero(body == _CR)
    if len(cr):
        lone_cr = cr[(cr + 1 >= len(body)) | (body[np.minimum(cr + 1, len(body) - 1)] != _LF)]
        terms = np.union1d(lf, lone_cr)
    else:
        terms = lf
    starts = np.empty(len(terms) + 1, np.int64)
    starts[0] = 0
    starts[1:] = terms + 1
    ends = np.append(terms, len(body)).astype(np.int64)
    if starts[-1] == len(body):  # no bytes after the last terminator: no extra line
        starts, ends = starts[:-1], ends[:-1]
    if len(cr):  # the \r of a \r\n is part of the terminator of the line the \n ends
        at = np.minimum(ends, len(body) - 1)
        before = np.maximum(ends - 1, 0)
        ends -= (ends < len(body)) & (ends > starts) & (body[at] == _LF) & (body[before] == _CR)
    return LineBlock(buf=buf, starts=starts + PAD, ends=ends + PAD, first_line=first_line)


def iter_line_blocks(path: str | Path, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Iterator[LineBlock]:
    """``path`` as consecutive ``LineBlock``s of about ``block_bytes`` each (longer if a line is)."""
    with open_binary(path) as f:
        try:
            yield from line_blocks_of(f, block_bytes)
        except GZIP_ERRORS as e:
            raise gzip_error(path, e) from None


def line_blocks_of(stream: BinaryIO, block_bytes: int) -> Iterator[LineBlock]:
    """The lines of a binary stream as ``LineBlock``s, reading ``block_bytes`` at a time."""
    first_line = 0
    carry = b""
    while True:
        chunk = stream.read(block_bytes)
        data = carry + chunk if carry else chunk
        cut = _cut(data, at_eof=not chunk)
        if cut == 0:
            if not chunk:
                return
            carry = data  # a line longer than a block: read on
            continue
        block = split_lines(data[:cut], first_line)
        first_line += len(block)
        carry = data[cut:]
        if len(block):
            yield block
