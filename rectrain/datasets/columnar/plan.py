"""Which rows make each rank's batches of a columnar source: the global windows of ``windows``, computed from
the row count instead of by counting.

An epoch reads its rows in one order (file order, or with ``shuffle`` a seeded permutation of fixed blocks of
rows that depends only on seed and epoch); a row's *position* is its place in that order. Rows whose position
is before the start position and rows the held-out split does not select (``Holdout``, by row number, so the
split does not change with the epoch's order) are dropped, and the rest are cut into windows exactly as
``windows.rank_windows`` cuts a text source (``window_bounds``, ``rank_block``). The data position after a
window is the position after its last row; in file order it is the row index the text readers report, so
TSV, converted and Parquet copies of the same rows give the same batches at the same positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rectrain.datasets.windows import Holdout, rank_block, window_bounds
from rectrain.errors import ConfigError

DEFAULT_SHUFFLE_BLOCK_ROWS = 8192


@dataclass(frozen=True)
class RowOrder:
    """The order an epoch reads ``num_rows`` rows in: blocks of ``block_rows`` rows, ``permutation`` of the
    blocks (None: file order)."""

    num_rows: int
    block_rows: int = DEFAULT_SHUFFLE_BLOCK_ROWS
    permutation: np.ndarray | None = None

    @classmethod
    def shuffled(cls, num_rows: int, seed: int, epoch: int, block_rows: int) -> RowOrder:
        """Blocks of ``block_rows`` rows in an order drawn from (seed, epoch) alone."""
        if block_rows < 1:
            raise ConfigError(f"shuffle_block_rows must be >= 1, got {block_rows}")
        blocks = -(-num_rows // block_rows)
        generator = np.random.Generator(np.random.PCG64([seed, epoch]))
        return cls(num_rows, block_rows, generator.permutation(blocks))

    def pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """(first row, first position) of each contiguous piece of rows, in row order."""
        if self.permutation is None or not len(self.permutation):
            return np.zeros(1, np.int64), np.zeros(1, np.int64)
        size, last = self.block_rows, len(self.permutation) - 1
        sizes = np.where(self.permutation == last, self.num_rows - last * size, size)
        positions = np.empty(len(self.permutation), np.int64)
        positions[self.permutation] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return np.arange(len(self.permutation), dtype=np.int64) * size, positions


@dataclass(frozen=True)
class EpochRows:
    """The rows an epoch trains on, in order: runs of consecutive rows ``rows[i] .. rows[i] + lengths[i]``
    at positions ``positions[i] ..``; ``before[i]`` counts the rows of the runs before run ``i``."""

    rows: np.ndarray
    positions: np.ndarray
    lengths: np.ndarray
    before: np.ndarray

    @property
    def total(self) -> int:
        return int(self.before[-1])

    def row_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Row ranges ``[a, b)`` holding rows ``start..stop`` of the epoch's rows, in order."""
        out = []
        i = int(np.searchsorted(self.before, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.before[i + 1]))
            row = int(self.rows[i]) + start - int(self.before[i])
            out.append((row, row + end - start))
            start, i = end, i + 1
        return out

    def position_after(self, index: int) -> int:
        """The data position after the epoch's row ``index``."""
        i = int(np.searchsorted(self.before, index, side="right")) - 1
        return int(self.positions[i]) + index - int(self.before[i]) + 1


def epoch_rows(order: RowOrder, select: Holdout | None = None, start: int = 0) -> EpochRows:
    """The rows of ``order`` from position ``start`` on that ``select`` keeps (see the module doc)."""
    n = order.num_rows
    if not 0 <= start <= n:
        raise ConfigError(f"start position {start} is outside the epoch's {n} rows")
    piece_rows, piece_positions = order.pieces()
    cuts = piece_rows
    if select is not None:  # pieces that lie in one held-out block each
        cuts = np.union1d(piece_rows, np.arange(0, n, select.block, dtype=np.int64))
    lengths = np.diff(np.append(cuts, n))
    owner = np.searchsorted(piece_rows, cuts, side="right") - 1
    positions = piece_positions[owner] + cuts - piece_rows[owner]
    keep = lengths > 0 if select is None else (lengths > 0) & select.keeps(cuts)
    rows, positions, lengths = cuts[keep], positions[keep], lengths[keep]
    ordered = np.argsort(positions, kind="stable")
    rows, positions, lengths = rows[ordered], positions[ordered], lengths[ordered]
    skip = np.clip(start - positions, 0, lengths)  # rows before the start position
    rows, positions, lengths = rows + skip, positions + skip, lengths - skip
    live = lengths > 0
    rows, positions, lengths = rows[live], positions[live], lengths[live]
    before = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return EpochRows(rows, positions, lengths, before)


def rank_windows_of(
    epoch: EpochRows, batch_size: int, rank: int, world_size: int, drop_last: bool = False
) -> Iterator[tuple[int, int, int]]:
    """``(start, stop, position after the window)`` of ``rank``'s rows of each window, as indices into the
    epoch's rows (``EpochRows.row_ranges``)."""
    for first, stop in window_bounds(0, epoch.total, batch_size, world_size, drop_last=drop_last):
        lo, hi = rank_block(stop - first, rank, world_size)
        yield first + lo, first + hi, epoch.position_after(stop - 1)
