"""The item catalogue a pipeline is exported with, read a batch of rows at a time (see docs/recommend.md).

TSV (UTF-8, one header row, tab-separated):

    item_id   genre   studio   dense:popularity   dense:age
    17        3,5     12       0.25               1.5

``item_id`` first (a non-negative int64, unique); a sparse column is a feature name and holds that item's
ids separated by ``,`` (empty: no id); a ``dense:<name>`` column holds one float. Parquet: the same column
names; a sparse column is ``int64`` (one id) or ``list<int64>``, a dense column a float. Either is read a
batch at a time, so reading a catalogue costs one batch of memory, whatever its size.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from recserve.errors import ExportError

ITEM_ID = "item_id"
DENSE_PREFIX = "dense:"


@dataclass(frozen=True)
class CatalogueColumns:
    """The catalogue's columns after ``item_id``: sparse feature names and dense column names, in order."""

    sparse: list[str]
    dense: list[str]


@dataclass
class ItemBatch:
    """Rows ``first..first+len`` of the catalogue: ids ``[b]``, per sparse feature ``(lengths [b], values)``
    (int64), dense ``[b, len(dense columns)]`` float32."""

    first: int
    item_ids: Tensor
    sparse: dict[str, tuple[Tensor, Tensor]]
    dense: Tensor

    def __len__(self) -> int:
        return int(self.item_ids.numel())


def _columns(header: list[str], where: str) -> CatalogueColumns:
    if not header or header[0] != ITEM_ID:
        raise ExportError(f"{where}: the first column must be {ITEM_ID!r}, got {header[:1]}")
    seen: set[str] = set()
    sparse, dense = [], []
    for name in header[1:]:
        if not name or name in seen or name == ITEM_ID:
            raise ExportError(f"{where}: column {name!r} is empty or repeated")
        seen.add(name)
        if name.startswith(DENSE_PREFIX):
            dense.append(name[len(DENSE_PREFIX) :])
        else:
            sparse.append(name)
    return CatalogueColumns(sparse, dense)


class Catalogue:
    """A catalogue file (``.tsv`` or ``.parquet``): ``columns`` and ``batches(rows)``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ExportError(f"{self.path}: catalogue file does not exist")
        self.parquet = self.path.suffix.lower() in (".parquet", ".pq")
        if self.parquet:
            import pyarrow.parquet as pq

            names = pq.ParquetFile(self.path).schema_arrow.names
        else:
            with self.path.open(newline="", encoding="utf-8") as f:
                names = next(csv.reader(f, delimiter="\t"), [])
        self.columns = _columns(names, str(self.path))

    def batches(self, rows: int) -> Iterator[ItemBatch]:
        """The catalogue, ``rows`` items at a time; ExportError naming the row and column of a bad cell."""
        source = self._parquet_rows(rows) if self.parquet else self._tsv_rows(rows)
        first = 0
        for block in source:
            yield self._batch(first, block)
            first += len(block)

    def _tsv_rows(self, rows: int) -> Iterator[list[tuple[int, list[str]]]]:
        width = 1 + len(self.columns.sparse) + len(self.columns.dense)
        block: list[tuple[int, list[str]]] = []
        with self.path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="\t")
            next(reader, None)
            for line, cells in enumerate(reader, start=2):
                if len(cells) != width:
                    raise ExportError(f"{self.path}:{line}: {len(cells)} columns, the header has {width}")
                block.append((line, cells))
                if len(block) == rows:
                    yield block
                    block = []
        if block:
            yield block

    def _parquet_rows(self, rows: int) -> Iterator[list[tuple[int, list[object]]]]:
        import pyarrow.parquet as pq

        names = [ITEM_ID, *self.columns.sparse, *(DENSE_PREFIX + d for d in self.columns.dense)]
        line = 0
        for record in pq.ParquetFile(self.path).iter_batches(batch_size=rows, columns=names):
            data = [record.column(n).to_pylist() for n in names]
            block = []
            for i in range(record.num_rows):
                block.append((line + i, [column[i] for column in data]))
            line += record.num_rows
            yield block

    def _batch(self, first: int, block: list[tuple[int, list]]) -> ItemBatch:
        n_sparse = len(self.columns.sparse)
        ids, dense = [], []
        lengths: list[list[int]] = [[] for _ in range(n_sparse)]
        values: list[list[int]] = [[] for _ in range(n_sparse)]
        for line, cells in block:
            where = f"{self.path}:{line}" if not self.parquet else f"{self.path}: row {line}"
            ids.append(_int(cells[0], f"{where}: {ITEM_ID}"))
            for j, name in enumerate(self.columns.sparse):
                bag = _bag(cells[1 + j], f"{where}: {name}")
                lengths[j].append(len(bag))
                values[j].extend(bag)
            row = [
                _float(c, f"{where}: {DENSE_PREFIX}{d}")
                for c, d in zip(cells[1 + n_sparse :], self.columns.dense)
            ]
            dense.append(row)
        sparse = {
            name: (torch.tensor(lengths[j], dtype=torch.int64), torch.tensor(values[j], dtype=torch.int64))
            for j, name in enumerate(self.columns.sparse)
        }
        dense_tensor = torch.tensor(dense, dtype=torch.float32).reshape(len(block), len(self.columns.dense))
        return ItemBatch(first, torch.tensor(ids, dtype=torch.int64), sparse, dense_tensor)


def _int(cell: object, where: str) -> int:
    try:
        value = int(cell) if not isinstance(cell, float) else None
    except (TypeError, ValueError):
        value = None
    if value is None or not 0 <= value < 2**63:
        raise ExportError(f"{where}: expected a non-negative int64, got {str(cell)[:40]!r}")
    return value


def _bag(cell: object, where: str) -> list[int]:
    if cell is None or cell == "":
        return []
    if isinstance(cell, list):
        return [_int(c, where) for c in cell]
    if isinstance(cell, int):
        return [_int(cell, where)]
    return [_int(c.strip(), where) for c in str(cell).split(",")]


def _float(cell: object, where: str) -> float:
    try:
        value = float(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ExportError(f"{where}: expected a float, got {str(cell)[:40]!r}") from None
    if not math.isfinite(value):
        raise ExportError(f"{where}: expected a finite float, got {value}")
    return value
