"""``ParquetSource``: users' own Parquet files, columns named in the config, read a row group at a time.

  label    a numeric or boolean column, float32; a null label is an error naming file, row and column
  dense    numeric columns, float32; null -> 0.0 (as an empty Criteo field)
  sparse   integer columns (one id per row; null -> no id) or lists of integers (any number of ids);
           id = value mod the table's rows (non-negative), so raw ids of any size fit the table

Row groups are decoded with pyarrow on one thread (the trainer owns the cores) and the last two are kept, so
consecutive batches decode each group once per rank.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rectrain.datasets.columnar.columns import Columns, JaggedColumn, read_rows
from rectrain.datasets.columnar.part_files import DataFormatError
from rectrain.errors import ConfigError

_CACHED_GROUPS = 2


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError("reading Parquet needs pyarrow: pip install pyarrow") from None
    return pyarrow


class ParquetSource:
    """Rows of Parquet ``paths`` in order, with the named label, dense and sparse columns."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        label_column: str,
        dense_columns: Sequence[str],
        sparse_columns: Sequence[str],
        table_rows: Sequence[int],
    ) -> None:
        pa = _pyarrow()
        if len(table_rows) != len(sparse_columns):
            raise ConfigError("ParquetSource: one table size per sparse column")
        self.paths = [Path(p) for p in paths]
        self.label_column, self.dense_columns = label_column, list(dense_columns)
        self.sparse_columns, self.table_rows = list(sparse_columns), [int(r) for r in table_rows]
        groups: list[tuple[int, int]] = []
        rows: list[int] = []
        self.file_starts: list[int] = []  # global row of each file's first row
        for index, path in enumerate(self.paths):
            self.file_starts.append(sum(rows))
            parquet = self._open(path)
            self._check_schema(pa, path, parquet.schema_arrow)
            metadata = parquet.metadata
            for group in range(metadata.num_row_groups):
                groups.append((index, group))
                rows.append(metadata.row_group(group).num_rows)
        self.groups = groups
        self.bounds = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._cache: OrderedDict[int, Columns] = OrderedDict()
        self._files: dict[int, Any] = {}

    @property
    def num_rows(self) -> int:
        return int(self.bounds[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": OrderedDict(), "_files": {}}

    def _open(self, path: Path) -> Any:
        if not path.is_file():
            raise FileNotFoundError(f"data file {path} does not exist or is not a file")
        try:
            return _pyarrow().parquet.ParquetFile(path)
        except Exception as e:  # pyarrow raises ArrowInvalid and friends for a file that is not Parquet
            raise DataFormatError(f"{path}: not a readable Parquet file ({e})") from None

    def _check_schema(self, pa: Any, path: Path, schema: Any) -> None:
        types = pa.types
        wanted = [(self.label_column, "label"), *((c, "dense") for c in self.dense_columns)]
        wanted += [(c, "sparse") for c in self.sparse_columns]
        for name, role in wanted:
            if name not in schema.names:
                raise ConfigError(f"{path}: no column {name!r} ({role}); the file has {schema.names}")
            kind = schema.field(name).type
            numeric = types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind)
            if role != "sparse" and not numeric:
                raise ConfigError(f"{path}: {role} column {name!r} has type {kind}; expected numbers")
            ids = types.is_integer(kind) or (types.is_list(kind) and types.is_integer(kind.value_type))
            if role == "sparse" and not ids:
                raise ConfigError(
                    f"{path}: sparse column {name!r} has type {kind}; expected integer ids or lists of them "
                    "(hash strings to integers first)"
                )

    def _group(self, index: int) -> Columns:
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        file_index, group = self.groups[index]
        if file_index not in self._files:
            self._files[file_index] = self._open(self.paths[file_index])
        names = [self.label_column, *self.dense_columns, *self.sparse_columns]
        table = self._files[file_index].read_row_group(group, columns=names, use_threads=False)
        first_row = int(self.bounds[index]) - self.file_starts[file_index]
        columns = self._decode(table, self.paths[file_index], first_row)
        self._cache[index] = columns
        if len(self._cache) > _CACHED_GROUPS:
            self._cache.popitem(last=False)
        return columns

    def _decode(self, table: Any, path: Path, first_row: int) -> Columns:
        pa = _pyarrow()
        pc = pa.compute
        label = table.column(self.label_column)
        if label.null_count:
            row = first_row + int(np.flatnonzero(pc.is_null(label).to_numpy(zero_copy_only=False))[0])
            raise DataFormatError(f"{path}: row {row}: label column {self.label_column!r} is null")
        labels = label.to_numpy().astype(np.float32)
        dense = np.empty((table.num_rows, len(self.dense_columns)), dtype=np.float32)
        for i, name in enumerate(self.dense_columns):
            as_float = pc.cast(table.column(name), pa.float32(), safe=False)
            dense[:, i] = pc.fill_null(as_float, 0.0).to_numpy()
        _check_finite(path, first_row, labels[:, None], [self.label_column], "label")
        _check_finite(path, first_row, dense, self.dense_columns, "dense")
        sparse = [
            self._ids(pa, table.column(n), n, rows, path)
            for n, rows in zip(self.sparse_columns, self.table_rows)
        ]
        if all(isinstance(s, np.ndarray) for s in sparse):
            ids = np.stack(sparse) if sparse else np.empty((0, table.num_rows), np.int64)
            return Columns(labels, dense, ids=ids)
        offsets = np.arange(table.num_rows + 1, dtype=np.int64)
        jagged = tuple(s if isinstance(s, JaggedColumn) else JaggedColumn(s, offsets) for s in sparse)
        return Columns(labels, dense, jagged=jagged)

    @staticmethod
    def _ids(pa: Any, column: Any, name: str, rows: int, path: Path) -> np.ndarray | JaggedColumn:
        column = column.combine_chunks()
        if pa.types.is_integer(column.type):
            if not column.null_count:
                return _modulo(column.to_numpy(), rows)
            present = column.is_valid().to_numpy(zero_copy_only=False)
            values = _modulo(column.drop_null().to_numpy(), rows)
            return JaggedColumn(values, np.concatenate([[0], np.cumsum(present, dtype=np.int64)]))
        values = column.flatten()
        if values.null_count:
            raise DataFormatError(f"{path}: sparse column {name!r} has null ids inside its lists")
        lengths = pa.compute.fill_null(pa.compute.list_value_length(column), 0).to_numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        return JaggedColumn(_modulo(values.to_numpy(), rows), offsets)

    def read(self, start: int, stop: int) -> Columns:
        """Rows ``start..stop`` (global row numbers over all files)."""
        return read_rows(self.bounds, self._group, start, stop)


def _check_finite(path: Path, first_row: int, values: np.ndarray, names: Sequence[str], role: str) -> None:
    """A NaN or infinite value (or one too large for float32) is a data error naming file, row and column:
    a model trained on it diverges, and no learning rate fixes that."""
    bad = ~np.isfinite(values)
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise DataFormatError(
            f"{path}: row {first_row + row}: {role} column {names[column]!r} is {values[row, column]} (as "
            "float32); replace NaN/inf in the file (a null reads as 0) or drop the row"
        )


def _modulo(values: np.ndarray, rows: int) -> np.ndarray:
    """``values mod rows`` in [0, rows) as int64, for any integer dtype (uint64 included)."""
    if values.dtype == np.uint64:
        return (values % np.uint64(rows)).astype(np.int64)
    return np.mod(values.astype(np.int64, copy=False), rows)
