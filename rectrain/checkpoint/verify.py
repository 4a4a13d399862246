"""Check a checkpoint without a model: files and checksums, tensor shapes and dtypes, and coverage (every row
and column of every table, and of its optimizer state, stored exactly once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from rectrain.checkpoint.errors import CheckpointError
from rectrain.checkpoint.files import check_file
from rectrain.checkpoint.manifest import (
    DENSE_FILE,
    MANIFEST,
    PER_ELEMENT,
    PER_ROW,
    Manifest,
    ShardEntry,
    StateEntry,
    read_manifest,
    resolve_step_dir,
)


@dataclass
class VerifyReport:
    """What ``verify_checkpoint`` found; ``ok`` when ``problems`` is empty."""

    step_dir: Path
    manifest: Manifest | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _expected_shape(kind: str, shard: ShardEntry) -> tuple[int, ...] | None:
    if kind == PER_ELEMENT:
        return (shard.num_rows, shard.num_cols)
    if kind == PER_ROW:
        return (shard.num_rows,)
    return None


def _coverage(what: str, state: StateEntry, shape: tuple[int, int]) -> list[str]:
    """Shards inside the table, not overlapping, and together exactly the whole table."""
    rows, cols = shape
    if state.kind not in (PER_ELEMENT, PER_ROW):
        return [] if state.shards else [f"{what}: no shard stored"]
    problems = []
    for s in state.shards:
        negative = min(s.row_offset, s.col_offset, s.num_rows, s.num_cols) < 0
        if negative or s.row_end > rows or s.col_end > cols:
            problems.append(
                f"{what}: shard rows {s.row_offset}+{s.num_rows}, cols {s.col_offset}+{s.num_cols} "
                f"({s.file}) lies outside the table {list(shape)}"
            )
    shards = sorted(state.shards, key=lambda s: (s.row_offset, s.col_offset))
    for i, a in enumerate(shards):
        for b in shards[i + 1 :]:
            if b.row_offset >= a.row_end:
                break
            if b.col_offset < a.col_end and a.col_offset < b.col_end:
                problems.append(f"{what}: shards in {a.file} and {b.file} overlap at row {b.row_offset}")
    area = sum(s.num_rows * s.num_cols for s in state.shards)
    if not problems and area != rows * cols:
        problems.append(f"{what}: the shards cover {area} of {rows * cols} values; a shard is missing")
    return problems


def _wanted_tensors(manifest: Manifest) -> dict[str, list[tuple[str, tuple[int, ...], str]]]:
    """``{file: [(tensor, shape, what)]}`` of every tensor the manifest names."""
    wanted: dict[str, list[tuple[str, tuple[int, ...], str]]] = {}
    for key, table in manifest.tables.items():
        for name, state in table.stored_states():
            for s in state.shards:
                wanted.setdefault(s.file, []).append((s.tensor, tuple(s.shape), f"{key} {name}"))
    for name, dense in manifest.dense_params.items():
        wanted.setdefault(DENSE_FILE, []).append((dense.tensor, tuple(dense.shape), f"dense {name}"))
    return wanted


def _shape_problems(manifest: Manifest) -> list[str]:
    """Recorded tensor shapes that do not fit their shard's rectangle."""
    problems = []
    for key, table in manifest.tables.items():
        for name, state in table.stored_states():
            for s in state.shards:
                expected = _expected_shape(state.kind, s)
                if expected is not None and tuple(s.shape) != expected:
                    problems.append(
                        f"{key} {name}: recorded shape {list(s.shape)} does not fit shard {expected}"
                    )
    return problems


def layout_problems(manifest: Manifest) -> list[str]:
    """Coverage, overlap and shape problems of the manifest alone (cheap: no file is opened)."""
    problems = []
    for key, table in manifest.tables.items():
        for name, state in table.stored_states():
            problems += _coverage(f"table {table.name!r} ({key}) {name}", state, table.global_shape)
    return problems + _shape_problems(manifest)


def check_layout(step_dir: Path, manifest: Manifest) -> None:
    """Raise CheckpointError with ``verify``'s messages unless every shard lies inside its table, none
    overlaps another and together they store each value exactly once (what every loader relies on)."""
    problems = layout_problems(manifest)
    if problems:
        raise CheckpointError(
            f"{step_dir}: the manifest's shards are inconsistent ({len(problems)} problem(s), as "
            f"`rectrain ckpt verify` reports): " + "; ".join(problems)
        )


def _tensor_problems(step_dir: Path, manifest: Manifest, readable: set[str]) -> list[str]:
    """Every tensor the manifest names exists with the recorded shape (reads file headers only)."""
    problems = []
    for file, tensors in _wanted_tensors(manifest).items():
        if file not in readable:
            continue  # already reported as missing or damaged
        with safe_open(str(step_dir / file), framework="pt") as handle:
            names = set(handle.keys())
            for tensor, shape, what in tensors:
                if tensor not in names:
                    problems.append(f"{step_dir / file}: missing tensor {tensor!r} ({what})")
                elif tuple(handle.get_slice(tensor).get_shape()) != shape:
                    stored = handle.get_slice(tensor).get_shape()
                    problems.append(
                        f"{step_dir / file}: {tensor!r} has shape {stored}, the manifest {list(shape)}"
                    )
    return problems


def verify_checkpoint(path: str | Path, step: int | None = None, checksums: bool = True) -> VerifyReport:
    """Check the checkpoint at ``path``; problems are collected (not raised) so that all are reported."""
    step_dir = resolve_step_dir(path, step)
    try:
        manifest = read_manifest(step_dir)
    except CheckpointError as e:
        return VerifyReport(step_dir, None, [str(e)])
    report = VerifyReport(step_dir, manifest)
    readable = set()
    for name, entry in sorted(manifest.files.items()):
        try:
            check_file(step_dir / name, entry, checksums)
            readable.add(name)
        except CheckpointError as e:
            report.problems.append(str(e))
    for file in sorted(set(_wanted_tensors(manifest)) - set(manifest.files)):
        report.problems.append(f"{step_dir / MANIFEST}: names {file!r} but records no checksum for it")
    report.problems += layout_problems(manifest)
    report.problems += _tensor_problems(step_dir, manifest, readable)
    return report
