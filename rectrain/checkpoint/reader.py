"""Read any rectangle of a saved table out of whatever shards it was saved as (re-sharding on load).

``CheckpointReader.read_into(entry, shard, out)`` assembles the requested rows/columns from the overlapping
saved shards straight into ``out`` (the model's own storage), reading only those slices, a bounded chunk at a
time and without mapping the files (``rectrain.safetensors_io``): a rank never holds more of a checkpoint
than its own shards. Optimizer state follows its kind:

- per element (``[rows, cols]``): cut exactly like the weight;
- per row (``[rows]``, row-wise Adagrad): a saved column shard keeps one accumulator per row for its own
  columns. Each target row takes the mean of the overlapping saved shards' values weighted by the number of
  overlapping columns. Merging column shards this way is exact (row-wise Adagrad's accumulator is the mean
  of the squared gradient over the row's columns); splitting copies the value to every new shard;
- scalar (Adam's step): the value of any saved shard (every shard counts the same steps).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rectrain.checkpoint.errors import CheckpointError
from rectrain.checkpoint.files import check_file
from rectrain.checkpoint.manifest import (
    DENSE_FILE,
    PER_ELEMENT,
    PER_ROW,
    Manifest,
    ShardEntry,
    StateEntry,
    torch_dtype,
)
from rectrain.checkpoint.verify import check_layout
from rectrain.planner.types import Shard
from rectrain.safetensors_io import SafetensorsFile, SafetensorsFormatError


def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int]:
    return max(a0, b0), min(a1, b1)


class CheckpointReader:
    """Slices of one checkpoint directory's files; each file is opened (and checked) once. A context manager.

    The manifest's layout (shards inside their tables, no overlap, full coverage, shapes that fit) is
    checked first, with ``rectrain ckpt verify``'s messages: slicing trusts those offsets.

    Args:
        step_dir: the ``step_<N>`` directory.
        manifest: its manifest.
        verify_checksums: check a file's sha256 when it is first opened (size is always checked).
    """

    def __init__(self, step_dir: Path, manifest: Manifest, verify_checksums: bool = True) -> None:
        check_layout(step_dir, manifest)
        self.step_dir = step_dir
        self.manifest = manifest
        self._verify = verify_checksums
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, Any] = {}

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def files_opened(self) -> list[str]:
        """The files read so far (each rank opens only those holding its slices)."""
        return sorted(self._handles)

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def _handle(self, file: str) -> Any:
        if file not in self._handles:
            path = self.step_dir / file
            expected = self.manifest.files.get(file)
            if expected is None:
                raise CheckpointError(
                    f"{self.step_dir / 'manifest.json'}: names {file!r} but has no checksum"
                )
            check_file(path, expected, self._verify)
            try:
                self._handles[file] = self._stack.enter_context(SafetensorsFile(path))
            except (OSError, SafetensorsFormatError) as e:
                raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
        return self._handles[file]

    def _slice(self, file: str, tensor: str) -> SafetensorsFile:
        """The open file holding ``tensor``, after checking it has it."""
        handle = self._handle(file)
        if tensor not in handle.specs:
            raise CheckpointError(f"{self.step_dir / file}: has no tensor {tensor!r} (the manifest lists it)")
        return handle

    def _shard_slice(self, saved: ShardEntry) -> SafetensorsFile:
        """A saved shard's file, after checking the stored shape is the one the manifest records."""
        handle = self._slice(saved.file, saved.tensor)
        stored = list(handle.specs[saved.tensor].shape)
        if stored != list(saved.shape):
            raise CheckpointError(
                f"{self.step_dir / saved.file}: {saved.tensor!r} has shape {stored}, "
                f"the manifest {list(saved.shape)}"
            )
        return handle

    def tensor(self, file: str, tensor: str) -> Tensor:
        """One whole stored tensor."""
        return self._slice(file, tensor).read(tensor)

    def dense(self, tensor: str) -> Tensor:
        return self.tensor(DENSE_FILE, tensor)

    def read(self, entry: StateEntry, target: Shard, what: str) -> Tensor:
        """The saved ``entry`` cut to ``target``'s rectangle (shaped by its kind); ``what`` names it."""
        dtype = torch_dtype(entry.dtype, what)
        if entry.kind == PER_ELEMENT:
            out = torch.empty(target.num_rows, target.num_cols, dtype=dtype)
            self._read_elements(entry, target, out, what)
            return out
        if entry.kind == PER_ROW:
            return self._read_rows(entry, target, dtype, what)
        if not entry.shards:
            raise CheckpointError(f"{what}: the checkpoint has no shard of it")
        first = entry.shards[0]
        return self.tensor(first.file, first.tensor)

    def _overlapping(self, entry: StateEntry, target: Shard) -> list[tuple[ShardEntry, int, int, int, int]]:
        found = []
        for saved in entry.shards:
            r0, r1 = _overlap(
                saved.row_offset, saved.row_end, target.row_offset, target.row_offset + target.num_rows
            )
            c0, c1 = _overlap(
                saved.col_offset, saved.col_end, target.col_offset, target.col_offset + target.num_cols
            )
            if r0 < r1 and c0 < c1:
                found.append((saved, r0, r1, c0, c1))
        return found

    def read_into(self, entry: StateEntry, target: Shard, out: Tensor, what: str) -> None:
        """Like :meth:`read`, but into ``out`` (the model's storage; any device) without a whole copy for
        per-element state (weights, moments): each overlapping saved slice goes in by bounded chunks."""
        if entry.kind != PER_ELEMENT:
            out.copy_(self.read(entry, target, what))
            return
        torch_dtype(entry.dtype, what)
        if tuple(out.shape) != (target.num_rows, target.num_cols):
            raise CheckpointError(
                f"{what}: checkpoint shape {[target.num_rows, target.num_cols]}, model {list(out.shape)}"
            )
        self._read_elements(entry, target, out, what)

    def _read_elements(self, entry: StateEntry, target: Shard, out: Tensor, what: str) -> None:
        covered = 0
        for saved, r0, r1, c0, c1 in self._overlapping(entry, target):
            rows = out[r0 - target.row_offset : r1 - target.row_offset]
            into = rows[:, c0 - target.col_offset : c1 - target.col_offset]
            cols = (c0 - saved.col_offset, c1 - saved.col_offset)
            self._shard_slice(saved).read_into(
                saved.tensor, into, (r0 - saved.row_offset, r1 - saved.row_offset), cols
            )
            covered += (r1 - r0) * (c1 - c0)
        if covered != target.num_rows * target.num_cols:
            raise CheckpointError(
                f"{what}: the saved shards cover {covered} of the {target.num_rows * target.num_cols} "
                "values of "
                f"rows {target.row_offset}+{target.num_rows}, cols {target.col_offset}+{target.num_cols}; "
                f"a shard is missing (files: {sorted({s.file for s in entry.shards})})"
            )

    def _read_rows(self, entry: StateEntry, target: Shard, dtype: torch.dtype, what: str) -> Tensor:
        total = torch.zeros(target.num_rows, dtype=torch.float64)
        width = torch.zeros(target.num_rows, dtype=torch.float64)
        for saved, r0, r1, c0, c1 in self._overlapping(entry, target):
            piece = self._shard_slice(saved).read_rows(saved.tensor, r0 - saved.row_offset, r1 - r0)
            rows = slice(r0 - target.row_offset, r1 - target.row_offset)
            # float64 sums of float32 values times small ints are exact: one contributor round-trips bitwise
            total[rows] += piece.to(torch.float64) * (c1 - c0)
            width[rows] += c1 - c0
        missing = (width == 0).nonzero()
        if missing.numel():
            row = target.row_offset + int(missing[0])
            raise CheckpointError(
                f"{what}: no saved shard holds row {row} (cols {target.col_offset}+{target.num_cols}); "
                f"a shard is missing (files: {sorted({s.file for s in entry.shards})})"
            )
        return (total / width).to(dtype)
