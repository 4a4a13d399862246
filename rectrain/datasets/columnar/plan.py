"""Which rows make each rank's batches: row ranges cut from one global order, so the position is global.

An epoch reads its rows in one order (file order, or with ``shuffle`` a seeded permutation of fixed blocks of
rows that depends only on seed and epoch). Step ``s`` from a global starting position ``start`` covers the
positions ``start + s*B*W .. start + (s+1)*B*W`` and rank ``r`` takes the ``r``-th ``B`` of them. After any
number of steps the job has consumed exactly the positions before ``start + steps*B*W``: resuming from that
one number with any world size reads every remaining row once. A last short step is split evenly over the
ranks (``drop_last`` leaves it out); one of fewer than ``W`` rows is left out, so every rank trains the same
number of batches.
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


def rank_ranges(
    num_rows: int, batch_size: int, world_size: int, rank: int, start: int = 0, drop_last: bool = False
) -> Iterator[tuple[int, int]]:
    """Positions ``[p, q)`` of ``rank``'s batches from global position ``start`` (see the module doc)."""
    if not 0 <= start <= num_rows:
        raise ConfigError(f"start position {start} is outside the epoch's {num_rows} rows")
    step_rows = batch_size * world_size
    full_steps, tail = divmod(num_rows - start, step_rows)
    for step in range(full_steps):
        first = start + step * step_rows + rank * batch_size
        yield first, first + batch_size
    if tail >= world_size and not drop_last:
        base = start + full_steps * step_rows
        yield base + tail * rank // world_size, base + tail * (rank + 1) // world_size


def batches_per_rank(
    num_rows: int, batch_size: int, world_size: int, start: int = 0, drop_last: bool = False
) -> int:
    """How many batches every rank reads from ``start`` to the end of the epoch."""
    full_steps, tail = divmod(num_rows - start, batch_size * world_size)
    return full_steps + int(tail >= world_size and not drop_last)
