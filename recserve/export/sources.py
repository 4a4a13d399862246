"""Where export reads fp32 tables from, a row range at a time: a state dict in memory, or a checkpoint.

A checkpoint source reads each requested row range out of whatever shards the checkpoint was saved as
(``rectrain.checkpoint.reader``), so export never holds more of a table than the slice it is quantizing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from torch import Tensor

from recserve.errors import ExportError
from rectrain.checkpoint.manifest import Manifest, read_manifest, resolve_step_dir
from rectrain.checkpoint.reader import CheckpointReader
from rectrain.planner.types import Shard


class TableSource(Protocol):
    """Tables by their prediction-module state-dict key."""

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The table's shape, None when the source has no such key."""

    def rows(self, key: str, start: int, end: int) -> Tensor:
        """Rows ``start..end`` of the table."""

    def counts(self, key: str) -> Tensor | None:
        """The table's int32 lookup counts per row from training, None when the source has none."""


class StateDictSource:
    """Tables of a state dict in memory, with the row counts ``counts`` (by the same keys) where known."""

    def __init__(self, state_dict: Mapping[str, Tensor], counts: Mapping[str, Tensor] | None = None) -> None:
        self._state = state_dict
        self._counts = counts or {}

    def shape(self, key: str) -> tuple[int, ...] | None:
        return tuple(self._state[key].shape) if key in self._state else None

    def rows(self, key: str, start: int, end: int) -> Tensor:
        return self._state[key][start:end]

    def counts(self, key: str) -> Tensor | None:
        return self._counts.get(key)


class CheckpointSource:
    """A training checkpoint read for export: dense state at once, table rows on demand. A context manager.

    Keys are the prediction module's (the manifest's ``prediction_prefix``, e.g. ``"model."``, removed).
    """

    def __init__(
        self, checkpoint: str | Path, step: int | None = None, verify_checksums: bool = True
    ) -> None:
        step_dir = resolve_step_dir(checkpoint, step)
        self.manifest: Manifest = read_manifest(step_dir)
        prefix = self.manifest.prediction_prefix
        self._entries = {}
        for key, entry in self.manifest.tables.items():
            if not key.startswith(prefix):
                raise ExportError(f"{step_dir}: table {key!r} lies outside the prediction module {prefix!r}")
            self._entries[key[len(prefix) :]] = (key, entry)
        self._reader = CheckpointReader(step_dir, self.manifest, verify_checksums)
        self.dense = {
            name[len(prefix) :]: self._reader.dense(entry.tensor)
            for name, entry in self.manifest.dense_params.items()
            if name.startswith(prefix)
        }

    def __enter__(self) -> CheckpointSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self._reader.close()

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...] | None:
        return tuple(self._entries[key][1].global_shape) if key in self._entries else None

    def rows(self, key: str, start: int, end: int) -> Tensor:
        saved_key, entry = self._entries[key]
        cols = entry.global_shape[1]
        return self._reader.read(entry.weight, Shard(start, end - start, 0, cols, 0), f"{saved_key} weight")

    def counts(self, key: str) -> Tensor | None:
        saved_key, entry = self._entries[key]
        if entry.row_counts is None:
            return None
        rows, cols = entry.global_shape
        return self._reader.read(entry.row_counts, Shard(0, rows, 0, cols, 0), f"{saved_key} row counts")
