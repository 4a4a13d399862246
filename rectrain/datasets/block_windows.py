"""Text files in global windows, a block of lines at a time: the windows of ``lines.text_windows`` for
vectorised parsers.

Lines are numbered across the files exactly as ``lines.numbered_lines`` numbers them (no header: the
vectorised readers take formats without one), rows before ``start_row`` and those the held-out split does
not select are dropped, and the rest are cut into windows with the rules of ``windows.rank_windows``: a
window is ``world_size * batch_size`` rows, a remainder of fewer than ``world_size`` rows joins the last one
(``drop_last`` drops a short last window), rank ``r`` takes block ``rank_block`` of it and DataLoader
workers take turns by window. Only this reader's blocks are handed to ``parse``; the lines of a window wait
as references into their ``LineBlock`` (one window and ``world_size`` rows ahead) until its size is known.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from rectrain.datasets.line_blocks import DEFAULT_BLOCK_BYTES, LineBlock, iter_line_blocks
from rectrain.datasets.windows import Holdout, rank_block

T = TypeVar("T")


@dataclass
class BlockLines:
    """Some lines of one ``LineBlock`` of file ``path``: ``lines`` (indices into the block) are rows
    ``rows`` (row indices across the files)."""

    path: str
    block: LineBlock
    lines: np.ndarray
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.lines)

    def part(self, start: int, stop: int) -> BlockLines:
        return BlockLines(self.path, self.block, self.lines[start:stop], self.rows[start:stop])


class _Pending:
    """Rows waiting for their window, oldest first."""

    def __init__(self) -> None:
        self.parts: deque[BlockLines] = deque()
        self.count = 0

    def append(self, part: BlockLines) -> None:
        self.parts.append(part)
        self.count += len(part)

    def pop(self, n: int) -> list[BlockLines]:
        """The first ``n`` rows."""
        out: list[BlockLines] = []
        while n:
            first = self.parts[0]
            if len(first) <= n:
                out.append(self.parts.popleft())
            else:
                out.append(first.part(0, n))
                self.parts[0] = first.part(n, len(first))
            n -= len(out[-1])
            self.count -= len(out[-1])
        return out


def kept_lines(
    paths: Sequence[str], start_row: int, select: Holdout | None, block_bytes: int
) -> Iterator[BlockLines]:
    """The lines of ``paths`` from row ``start_row`` on that ``select`` keeps, a block at a time."""
    base = 0
    for path in paths:
        lines_in_file = 0
        for block in iter_line_blocks(path, block_bytes):
            rows = base + block.first_line + np.arange(len(block), dtype=np.int64)
            lines_in_file = block.first_line + len(block)
            keep = rows >= start_row
            if select is not None:
                keep &= select.keeps(rows)
            lines = np.flatnonzero(keep)
            if len(lines):
                yield BlockLines(str(path), block, lines, rows[lines])
        base += lines_in_file


def _cut(parts: list[BlockLines], start: int, stop: int) -> list[BlockLines]:
    """Rows ``start..stop`` of the rows of ``parts``."""
    out, offset = [], 0
    for part in parts:
        lo, hi = max(start - offset, 0), min(stop - offset, len(part))
        if hi > lo:
            out.append(part.part(lo, hi))
        offset += len(part)
    return out


def block_windows(
    paths: Sequence[str],
    parse: Callable[[list[BlockLines]], T],
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    owned: Callable[[int], bool],
    start_row: int = 0,
    select: Holdout | None = None,
    drop_last: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[tuple[T, int]]:
    """``(parse(this rank's lines of window k), row index after window k)`` of each window ``k`` with
    ``owned(k)``, in order (see the module doc)."""
    size = batch_size * world_size
    pending = _Pending()
    index = 0

    def window(n: int) -> Iterator[tuple[T, int]]:
        nonlocal index
        parts = pending.pop(n)
        mine, index = owned(index), index + 1
        if mine:
            lo, hi = rank_block(n, rank, world_size)
            yield parse(_cut(parts, lo, hi)), int(parts[-1].rows[-1]) + 1

    for part in kept_lines(paths, start_row, select, block_bytes):
        pending.append(part)
        while pending.count >= size + world_size:  # a full window, and no remainder can join it
            yield from window(size)
    if drop_last:
        while pending.count >= size:
            yield from window(size)
    elif pending.count:
        yield from window(pending.count)  # the last window, with a remainder under world_size joined
