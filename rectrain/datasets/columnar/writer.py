"""``ColumnarWriter``: row blocks in, part files of ``rows_per_part`` rows out, the manifest last.

A part is buffered in memory (``rows_per_part`` x (4 + 4 D + 4 K) bytes with int32 ids: 160 MB for a million
Criteo rows), written with ``write_part`` (temp, fsync, rename) and forgotten; the manifest that lists the
parts is written only when every part is on disk, so a crashed conversion leaves no manifest behind.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rectrain.datasets.columnar.manifest import MANIFEST, ColumnarManifest, PartEntry
from rectrain.datasets.columnar.part_files import DataFormatError, write_part

logger = logging.getLogger(__name__)

DEFAULT_ROWS_PER_PART = 1 << 20
_OURS = ("part-*.safetensors", ".part-*.safetensors.tmp", f".{MANIFEST}.*.tmp")


def prepare_output_dir(directory: Path, overwrite: bool) -> None:
    """Create ``directory``; one holding files refuses unless ``overwrite`` (then only our files go)."""
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.iterdir()):
        return
    if not overwrite:
        raise DataFormatError(f"{directory}: not empty; choose a new directory or pass --overwrite")
    (directory / MANIFEST).unlink(missing_ok=True)  # first: a half-replaced directory never looks complete
    for pattern in _OURS:
        for path in directory.glob(pattern):
            path.unlink()


def id_dtype_for(table_rows: list[int]) -> np.dtype:
    """int32 when every id fits (half the bytes of int64), else int64."""
    return np.dtype(np.int32 if max(table_rows, default=1) <= 2**31 else np.int64)


class ColumnarWriter:
    """Collects rows (``append``) into parts under ``directory``; ``finish`` writes the manifest."""

    def __init__(self, directory: Path, template: ColumnarManifest, rows_per_part: int) -> None:
        if rows_per_part < 1:
            raise ValueError(f"rows_per_part must be >= 1, got {rows_per_part}")
        self.directory, self.template, self.rows_per_part = Path(directory), template, rows_per_part
        self._id_dtype = np.dtype(template.id_dtype)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self.parts: list[PartEntry] = []

    def append(self, labels: np.ndarray, dense: np.ndarray, ids: np.ndarray) -> None:
        """Rows in order: labels ``[n]``, dense ``[n, D]``, ids ``[n, K]`` (row-major, as parsed)."""
        self._pending.append((labels, dense, ids))
        self._pending_rows += len(labels)
        while self._pending_rows >= self.rows_per_part:
            self._flush(self.rows_per_part)

    def _flush(self, rows: int) -> None:
        labels, dense, ids = (np.concatenate(column) for column in zip(*self._pending))
        name = f"part-{len(self.parts):05d}.safetensors"
        digest = write_part(
            self.directory / name,
            {
                "sparse": np.ascontiguousarray(ids[:rows].T, dtype=self._id_dtype),
                "dense": np.ascontiguousarray(dense[:rows], dtype=np.float32),
                "label": np.ascontiguousarray(labels[:rows], dtype=np.float32),
            },
        )
        self.parts.append(PartEntry(path=name, rows=rows, bytes=digest.bytes, sha256=digest.sha256))
        logger.debug("wrote %s (%d rows)", name, rows)
        rest = len(labels) - rows
        self._pending = [(labels[rows:], dense[rows:], ids[rows:])] if rest else []
        self._pending_rows = rest

    def finish(self, source: dict[str, Any]) -> ColumnarManifest:
        """Write the last part and the manifest (atomically); return the manifest."""
        if self._pending_rows:
            self._flush(self._pending_rows)
        manifest = replace(self.template, parts=list(self.parts), source=source)
        manifest.save(self.directory)
        return manifest
