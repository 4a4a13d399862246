"""``Columns``: rows of a columnar source as NumPy arrays, sliced, joined and turned into a ``Batch``.

Sparse features come in one of two shapes: ``ids`` ``[K, n]`` (one id per row and feature, feature-major so
a batch's KJT values are one copy; converted files and scalar Parquet columns) or ``jagged`` (per feature,
values and ``n + 1`` offsets; Parquet list columns and nullable columns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rectrain.datasets.batching import batch_from_arrays, make_batch
from rectrain.models.batch import Batch


@dataclass(frozen=True)
class JaggedColumn:
    """One feature's ids: row ``i`` holds ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray
    offsets: np.ndarray

    def slice(self, start: int, stop: int) -> JaggedColumn:
        begin, end = self.offsets[start], self.offsets[stop]
        return JaggedColumn(self.values[begin:end], self.offsets[start : stop + 1] - begin)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class Columns:
    """``n`` rows: labels ``[n]``, dense ``[n, D]``, and sparse ids as ``ids`` ``[K, n]`` or ``jagged``."""

    labels: np.ndarray
    dense: np.ndarray
    ids: np.ndarray | None = None
    jagged: tuple[JaggedColumn, ...] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def slice(self, start: int, stop: int) -> Columns:
        """Rows ``start..stop`` (views where the arrays allow)."""
        return Columns(
            self.labels[start:stop],
            self.dense[start:stop],
            None if self.ids is None else self.ids[:, start:stop],
            None if self.jagged is None else tuple(c.slice(start, stop) for c in self.jagged),
        )

    def as_jagged(self) -> tuple[JaggedColumn, ...]:
        if self.jagged is not None:
            return self.jagged
        assert self.ids is not None
        offsets = np.arange(len(self) + 1, dtype=np.int64)
        return tuple(JaggedColumn(row, offsets) for row in self.ids)


def concat_columns(parts: Sequence[Columns]) -> Columns:
    """The rows of ``parts`` in order (``parts[0]`` itself when there is one)."""
    if len(parts) == 1:
        return parts[0]
    labels = np.concatenate([p.labels for p in parts])
    dense = np.concatenate([p.dense for p in parts])
    if all(p.ids is not None for p in parts):
        return Columns(labels, dense, ids=np.concatenate([p.ids for p in parts], axis=1))
    features = zip(*(p.as_jagged() for p in parts))
    return Columns(labels, dense, jagged=tuple(_concat_jagged(f) for f in features))


def read_rows(bounds: np.ndarray, load: Callable[[int], Columns], start: int, stop: int) -> Columns:
    """Rows ``start..stop`` of a source stored in pieces (part files, row groups): piece ``i`` holds rows
    ``bounds[i]..bounds[i + 1]`` and ``load(i)`` reads it."""
    index = int(np.searchsorted(bounds, start, side="right")) - 1
    pieces = []
    while start < stop:
        piece_start, piece_stop = int(bounds[index]), int(bounds[index + 1])
        end = min(stop, piece_stop)
        if end > start:
            pieces.append(load(index).slice(start - piece_start, end - piece_start))
        start, index = end, index + 1
    if not pieces:  # no rows: an empty slice keeps the columns' shapes
        return load(0).slice(0, 0)
    return concat_columns(pieces)


def _concat_jagged(parts: Sequence[JaggedColumn]) -> JaggedColumn:
    ends = np.cumsum([0] + [len(p.values) for p in parts[:-1]])
    offsets = np.concatenate([parts[0].offsets[:1]] + [p.offsets[1:] + e for p, e in zip(parts, ends)])
    return JaggedColumn(np.concatenate([p.values for p in parts]), offsets)


def columns_to_batch(columns: Columns, keys: Sequence[str], label_threshold: float | None = None) -> Batch:
    """A ``Batch`` of ``columns`` (own copies); labels become ``label >= label_threshold`` when it is set."""
    labels = columns.labels.astype(np.float32, copy=False)
    if label_threshold is not None:
        labels = (labels >= np.float32(label_threshold)).astype(np.float32)
    if columns.ids is not None:
        return batch_from_arrays(keys, labels, columns.dense, columns.ids)
    jagged = columns.jagged or ()
    return make_batch(
        dense=torch.from_numpy(np.array(columns.dense, dtype=np.float32, copy=True)),
        keys=keys,
        values=[torch.from_numpy(np.array(c.values, dtype=np.int64, copy=True)) for c in jagged],
        lengths=[torch.from_numpy(c.lengths().astype(np.int32)) for c in jagged],
        labels=torch.from_numpy(np.array(labels, dtype=np.float32, copy=True)),
    )
