"""Which rows make each rank's batches: row ranges cut from one global order, so the position is global.

An epoch reads its rows in one order (file order, or with ``shuffle`` a seeded permutation of fixed blocks of
rows that depends only on seed and epoch). Step ``s`` from a global starting position ``start`` covers the
positions ``start + s*B*W .. start + (s+1)*B*W`` (its window) and rank ``r`` takes the ``r``-th ``B`` of them.
After any number of steps the job has consumed exactly the positions before the next window: resuming from
that one number with any world size reads every remaining row once. At the end of an epoch a remainder of
fewer than ``W`` rows joins the window before it and a short last window is split evenly over the ranks
(``drop_last`` drops a short last window instead), so every rank trains the same number of batches and every
row is read. These are the windows of the text sources' global positions (``window_bounds``/``rank_block``
compute the same ranges for a reader that knows its row count).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rectrain.errors import ConfigError

DEFAULT_SHUFFLE_BLOCK_ROWS = 8192


@dataclass(frozen=True)
class RowOrder:
    """The order an epoch reads ``num_rows`` rows in: ``segments(p, q)`` maps positions to row ranges."""

    num_rows: int
    block_rows: int = DEFAULT_SHUFFLE_BLOCK_ROWS
    permutation: np.ndarray | None = None  # of blocks; None = file order

    @classmethod
    def shuffled(cls, num_rows: int, seed: int, epoch: int, block_rows: int) -> RowOrder:
        """Blocks of ``block_rows`` rows in an order drawn from (seed, epoch) alone."""
        if block_rows < 1:
            raise ConfigError(f"shuffle_block_rows must be >= 1, got {block_rows}")
        blocks = -(-num_rows // block_rows)
        generator = np.random.Generator(np.random.PCG64([seed, epoch]))
        return cls(num_rows, block_rows, generator.permutation(blocks))

    def segments(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Row ranges ``[a, b)`` holding positions ``start..stop`` of this order, in order."""
        if self.permutation is None:
            return [(start, stop)] if stop > start else []
        size, last = self.block_rows, len(self.permutation) - 1
        sizes = np.where(self.permutation == last, self.num_rows - last * size, size)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        out = []
        i = int(np.searchsorted(bounds, start, side="right")) - 1
        while start < stop:
            block_end = int(bounds[i + 1])
            end = min(stop, block_end)
            row = int(self.permutation[i]) * size + start - int(bounds[i])
            out.append((row, row + end - start))
            start, i = end, i + 1
        return out


def window_bounds(
    start: int, total: int, batch_size: int, world_size: int, drop_last: bool = False
) -> Iterator[tuple[int, int]]:
    """Positions ``[first, stop)`` of each step's window of ``batch_size * world_size`` positions from
    ``start``; a remainder of fewer than ``world_size`` positions joins the window before it, and
    ``drop_last`` drops a last window that is short."""
    size = batch_size * world_size
    first = start
    while first < total:
        stop = min(first + size, total)
        if drop_last and stop - first < size:
            return
        if not drop_last and 0 < total - stop < world_size:
            stop = total
        yield first, stop
        first = stop


def rank_block(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of ``rank``'s part of a window of ``size`` positions: near-equal contiguous blocks in
    rank order (``batch_size`` each in a full window)."""
    return size * rank // world_size, size * (rank + 1) // world_size


def rank_ranges(
    num_rows: int, batch_size: int, world_size: int, rank: int, start: int = 0, drop_last: bool = False
) -> Iterator[tuple[int, int]]:
    """Positions ``[p, q)`` of ``rank``'s batches from global position ``start`` (see the module doc)."""
    if not 0 <= start <= num_rows:
        raise ConfigError(f"start position {start} is outside the epoch's {num_rows} rows")
    for first, stop in window_bounds(start, num_rows, batch_size, world_size, drop_last):
        lo, hi = rank_block(stop - first, rank, world_size)
        if hi > lo:  # empty only when the whole rest of the epoch has fewer rows than ranks
            yield first + lo, first + hi


def batches_per_rank(
    num_rows: int, batch_size: int, world_size: int, start: int = 0, drop_last: bool = False
) -> int:
    """How many batches every rank reads from ``start`` to the end of the epoch."""
    return sum(1 for _ in window_bounds(start, num_rows, batch_size, world_size, drop_last))
