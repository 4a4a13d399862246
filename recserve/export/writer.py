"""Write a model package atomically and a table slice at a time.

Files go to a temporary sibling directory, are fsynced and checksummed, and the directory is renamed into
place, so a reader (or a server watching the parent) never sees half a package. Each device's file is laid
out up front from the placement (one ``"<table>[a:b].rows"`` tensor of kernel rows per shard) and filled as
the exporter quantizes each table's rows, so no more than one slice of quantized rows is ever in memory.
Layout and names: ``recserve.runtime.package``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from recserve.errors import ExportError
from recserve.runtime.layout import TableDType, row_bytes
from recserve.runtime.package import (
    DENSE_FILE,
    MANIFEST_FILE,
    PackageManifest,
    embeddings_file,
    rows_key,
    version_problem,
)
from recserve.runtime.placement import ServingPlacement, TableShard
from recserve.runtime.pruning import REMAP_FILE, remap_key
from rectrain.durable import follow_umask, fsync_path, sha256_file
from rectrain.safetensors_io import SafetensorsWriter, TensorSpec, save_tensors


def _entry(path: Path) -> dict[str, object]:
    """The manifest entry (sha256, bytes) of a written file."""
    follow_umask(path)
    fsync_path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


class PackageWriter:
    """A package in its staging directory: ``write_rows`` per table slice, then ``finish`` (or ``abort``).

    Args:
        out_dir: the package directory to create.
        placement: which device file holds which rows of each table.
        tables: ``{table: (embedding_dim, dtype)}``.
        overwrite: replace a non-empty ``out_dir``.
        pruned: the rows stored for each shard of a pruned table (its kept rows, plus a default row); those
            shards are written with ``write_shard_rows`` and get a remap (``write_remap``).
    """

    def __init__(
        self,
        out_dir: str | Path,
        placement: ServingPlacement,
        tables: Mapping[str, tuple[int, TableDType]],
        *,
        overwrite: bool = False,
        pruned: Mapping[TableShard, int] | None = None,
    ) -> None:
        self.out = Path(out_dir)
        if self.out.exists() and any(self.out.iterdir()) and not overwrite:
            raise ExportError(
                f"{self.out}: exists and is not empty; choose a new directory or pass overwrite (--overwrite)"
            )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.staging = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}"
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir()
        self._placement = placement
        self._files: dict[str, SafetensorsWriter] = {}
        pruned = pruned or {}
        for index, device in enumerate(placement.devices):
            specs = [
                TensorSpec(rows_key(s), torch.uint8, (pruned.get(s, s.num_rows), row_bytes(*tables[s.table])))
                for s in placement.shards
                if s.device == device
            ]
            if specs:
                self._files[device] = SafetensorsWriter(
                    self.staging / embeddings_file(index), specs, metadata={"format": "pt"}
                )
        self._remaps = None
        if pruned:
            specs = [TensorSpec(remap_key(s), torch.int32, (s.num_rows,)) for s in pruned]
            self._remaps = SafetensorsWriter(self.staging / REMAP_FILE, specs, metadata={"format": "pt"})

    def write_rows(self, table: str, start: int, rows: Tensor) -> None:
        """Store kernel rows ``start..start + len(rows)`` of ``table`` in the shards that hold them."""
        end = start + rows.shape[0]
        for shard in self._placement.shards_of(table):
            lo, hi = max(start, shard.row_start), min(end, shard.row_end)
            if lo < hi:
                self._files[shard.device].write(
                    rows_key(shard), rows[lo - start : hi - start], lo - shard.row_start
                )

    def write_shard_rows(self, shard: TableShard, start: int, rows: Tensor) -> None:
        """Store kernel rows as stored rows ``start..`` of a pruned ``shard`` (kept rows, or its default)."""
        self._files[shard.device].write(rows_key(shard), rows, start)

    def write_remap(self, shard: TableShard, remap: Tensor) -> None:
        """Store a pruned shard's index remap (int32, one entry per id of the shard)."""
        assert self._remaps is not None, "remaps are written for pruned shards only"
        self._remaps.write(remap_key(shard), remap)

    def finish(self, manifest: PackageManifest, dense_state: Mapping[str, Tensor]) -> Path:
        """Close the files, write the dense part and the manifest (with every file's checksum), publish."""
        try:
            problem = version_problem(manifest.version)
            if problem:  # the runtime refuses such a manifest: never publish one
                raise ExportError(f"{self.out}: --version: {problem}")
            files = {}
            for writer in [*self._files.values(), *([self._remaps] if self._remaps else [])]:
                writer.close()
                files[writer.path.name] = _entry(writer.path)
            dense_path = self.staging / DENSE_FILE
            save_tensors(dense_path, {k: v.contiguous() for k, v in dense_state.items()}, {"format": "pt"})
            files[DENSE_FILE] = _entry(dense_path)
            manifest.files = dict(sorted(files.items()))
            manifest_path = self.staging / MANIFEST_FILE
            manifest_path.write_text(json.dumps(manifest.to_dict(), indent=1) + "\n")
            fsync_path(manifest_path)
            fsync_path(self.staging)
            if self.out.exists():
                shutil.rmtree(self.out)
            os.replace(self.staging, self.out)
            fsync_path(self.out.parent)
        except BaseException:
            self.abort()
            raise
        return self.out

    def abort(self) -> None:
        """Drop everything written so far."""
        for writer in [*self._files.values(), *([self._remaps] if self._remaps else [])]:
            writer.abort()
        shutil.rmtree(self.staging, ignore_errors=True)
