"""``ConvertedSource``: the rows of converted directories (``rectrain data convert``), read memory-mapped.

Opening checks every manifest and that each part file has its recorded size (cheap; ``rectrain data verify``
also checks the sha256s). Maps are opened on first read in the process that reads, so a source can be sent
to DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rectrain.datasets.columnar.columns import Columns, read_rows
from rectrain.datasets.columnar.manifest import ColumnarManifest
from rectrain.datasets.columnar.part_files import DataFormatError, read_part


def _same_layout(a: ColumnarManifest, b: ColumnarManifest) -> bool:
    keys = ("kind", "label", "dense_features", "sparse_features", "table_rows")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


class ConvertedSource:
    """Rows of one or more converted directories, in the order given."""

    def __init__(self, locations: Sequence[str | Path]) -> None:
        if not locations:
            raise DataFormatError("converted data: no directories given")
        loaded = [ColumnarManifest.load(location) for location in locations]
        self.manifest = loaded[0][0]
        self.files: list[Path] = []
        rows: list[int] = []
        for (manifest, directory), location in zip(loaded, locations):
            if not _same_layout(manifest, self.manifest):
                raise DataFormatError(
                    f"{location}: its columns or table sizes differ from {locations[0]}; "
                    "convert all directories of one run with the same settings"
                )
            manifest.check_files(directory)
            self.files += [directory / p.path for p in manifest.parts]
            rows += [p.rows for p in manifest.parts]
        self.bounds = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._parts: dict[int, Columns] = {}

    @property
    def num_rows(self) -> int:
        return int(self.bounds[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_parts": {}}  # maps are reopened where the source is read

    def _part(self, index: int) -> Columns:
        if index not in self._parts:
            path, rows = self.files[index], int(self.bounds[index + 1] - self.bounds[index])
            tensors = read_part(path)
            m = self.manifest
            expected = {
                "label": ((rows,), np.float32),
                "dense": ((rows, len(m.dense_features)), np.float32),
                "sparse": ((len(m.sparse_features), rows), np.dtype(m.id_dtype)),
            }
            for name, (shape, dtype) in expected.items():
                got = tensors.get(name)
                if got is None or got.shape != shape or got.dtype != dtype:
                    found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
                    raise DataFormatError(
                        f"{path}: tensor {name!r} should be {np.dtype(dtype)}{list(shape)}, is {found}"
                    )
            self._parts[index] = Columns(tensors["label"], tensors["dense"], ids=tensors["sparse"])
        return self._parts[index]

    def check_parts(self) -> None:
        """Open every part: its header, dtypes and shapes must match the manifest (else DataFormatError)."""
        for index in range(len(self.files)):
            self._part(index)

    def read(self, start: int, stop: int) -> Columns:
        """Rows ``start..stop`` (global row numbers over all parts)."""
        return read_rows(self.bounds, self._part, start, stop)
