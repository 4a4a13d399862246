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

import numpy as np
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
        self.header = list(names)

    def batches(self, rows: int) -> Iterator[ItemBatch]:
        """The catalogue, at most ``rows`` items a batch; ExportError naming the row and column of a bad cell.

        Columns are parsed vectorised (pyarrow); a block whose cells do not all parse that way is parsed again
        cell by cell, which names the first bad cell (or accepts what Python's ``int``/``float`` accept)."""
        first = 0
        for names, table in self._arrow_blocks(rows):
            for start in range(0, table.num_rows, rows):
                part = table.slice(start, rows)
                batch = _fast_batch(first, part, self.columns)
                if batch is None:
                    batch = self._batch(first, self._cells(first, part, names))
                yield batch
                first += len(batch)

    def _arrow_blocks(self, rows: int) -> Iterator[tuple[list[str], object]]:
        names = [ITEM_ID, *self.columns.sparse, *(DENSE_PREFIX + d for d in self.columns.dense)]
        if self.parquet:
            import pyarrow.parquet as pq

            for record in pq.ParquetFile(self.path).iter_batches(batch_size=rows, columns=names):
                yield names, record
            return
        import pyarrow as pa
        import pyarrow.csv as pcsv

        done = 0
        try:
            reader = pcsv.open_csv(
                self.path,
                # About 32 bytes a row: a block of the file holds about ``rows`` rows.
                read_options=pcsv.ReadOptions(block_size=max(1 << 16, 32 * rows), encoding="utf8"),
                parse_options=pcsv.ParseOptions(delimiter="\t", ignore_empty_lines=False),
                convert_options=pcsv.ConvertOptions(
                    column_types={n: pa.string() for n in names},
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
            for record in reader:
                yield self.header, record
                done += record.num_rows
        except (pa.ArrowInvalid, UnicodeDecodeError):
            # A malformed line (a wrong number of cells, bad UTF-8): the csv module reads on from the
            # rows already given and names the line.
            for block in self._tsv_rows(rows, skip=done):
                yield self.header, _strings_table(self.header, block)

    def _cells(self, first: int, part, names: list[str]) -> list[tuple[int, list]]:
        """The rows of an arrow block as Python cells with their line (TSV) or row (Parquet) number."""
        order = [names.index(n) for n in (ITEM_ID, *self.columns.sparse)]
        order += [names.index(DENSE_PREFIX + d) for d in self.columns.dense]
        data = [part.column(i).to_pylist() for i in order]
        base = first if self.parquet else first + 2  # TSV lines count from 1, after the header
        return [(base + i, [column[i] for column in data]) for i in range(part.num_rows)]

    def _tsv_rows(self, rows: int, skip: int = 0) -> Iterator[list[tuple[int, list[str]]]]:
        width = 1 + len(self.columns.sparse) + len(self.columns.dense)
        block: list[tuple[int, list[str]]] = []
        with self.path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="\t")
            next(reader, None)
            for line, cells in enumerate(reader, start=2):
                if line - 2 < skip:
                    continue
                if len(cells) != width:
                    raise ExportError(f"{self.path}:{line}: {len(cells)} columns, the header has {width}")
                block.append((line, cells))
                if len(block) == rows:
                    yield block
                    block = []
        if block:
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


def _strings_table(names: list[str], block: list[tuple[int, list[str]]]):
    import pyarrow as pa

    return pa.table({n: [cells[j] for _, cells in block] for j, n in enumerate(names)})


def _fast_batch(first: int, part, columns: CatalogueColumns) -> ItemBatch | None:
    """The block parsed column by column, or None if a cell does not parse that way (then cell by cell)."""
    import pyarrow as pa

    try:
        ids = _int_column(part.column(ITEM_ID))
        if ids is None:
            return None
        sparse = {}
        for name in columns.sparse:
            bag = _bag_column(part.column(name))
            if bag is None:
                return None
            sparse[name] = bag
        dense = np.zeros((part.num_rows, len(columns.dense)), dtype=np.float32)
        for j, name in enumerate(columns.dense):
            column = part.column(DENSE_PREFIX + name)
            if column.null_count:
                return None
            values = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
            if not np.isfinite(values).all():
                return None
            dense[:, j] = values
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return ItemBatch(first, torch.from_numpy(ids), sparse, torch.from_numpy(dense))


def _int_column(column) -> np.ndarray | None:
    """Non-negative int64 ids of a column of integers or of decimal strings; None if any is not one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        return None
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.int64())
    elif pa.types.is_integer(column.type):
        big = pa.types.is_unsigned_integer(column.type) and column.type.bit_width == 64
        if big and len(column) and pc.max(column).as_py() >= 2**63:
            return None
        column = column.cast(pa.int64())
    else:
        return None
    values = np.array(column.to_numpy(zero_copy_only=False), dtype=np.int64)  # writable, for torch
    if values.size and values.min() < 0:
        return None
    return values


def _bag_column(column) -> tuple[Tensor, Tensor] | None:
    """``(lengths, values)`` of a sparse column: ``a,b`` strings (empty: no id), integers or lists of them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if column.null_count:
            return None
        empty = pc.equal(column, "").to_numpy(zero_copy_only=False)
        column = pc.split_pattern(column, ",")
        lengths = np.array(pc.list_value_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)
        lengths[empty] = 0
        cells = pc.utf8_trim_whitespace(pc.list_flatten(column))
        if empty.any():
            # An empty cell splits into one "" (no id): drop exactly those.
            keep = np.repeat(~empty, pc.list_value_length(column).to_numpy(zero_copy_only=False))
            cells = cells.filter(pa.array(keep))
        values = _int_column(cells)
    elif pa.types.is_integer(kind):
        lengths = np.where(column.is_valid().to_numpy(zero_copy_only=False), 1, 0).astype(np.int64)
        values = _int_column(column.drop_null())
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not pa.types.is_integer(kind.value_type):
            return None
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        lengths = np.array(lengths, dtype=np.int64)
        values = _int_column(pc.list_flatten(column))
    else:
        return None
    if values is None or int(lengths.sum()) != values.size:
        return None
    return torch.from_numpy(lengths), torch.from_numpy(values)
