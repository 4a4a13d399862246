"""The checkpoint manifest: what a checkpoint holds and where every tensor lives (``manifest.json``).

A checkpoint directory is ``step_<N>/`` with ``manifest.json``, one ``rank_<r>.safetensors`` per rank (that
rank's table shards, their optimizer state and its RNG state) and ``dense.safetensors`` (dense parameters and
dense optimizer state, written once). The manifest is the only index: it records every table's global shape
and every shard's rectangle, so a loader reads exactly the slices it needs. ``data_position`` (optional; a
training run's ``DataPosition``, see ``rectrain.datasets.windows``) says how much of the data the job had
consumed. The format is documented in ``docs/checkpoint-format.md``; bump ``FORMAT_VERSION`` on any
incompatible change (an optional new field is not one: older checkpoints simply lack it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rectrain.checkpoint.errors import CheckpointError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DENSE_FILE = "dense.safetensors"
LATEST = "latest"
STEP_PREFIX = "step_"

# How an optimizer state tensor relates to its shard's rectangle (decides how it is re-sharded).
PER_ELEMENT = "per_element"  # [num_rows, num_cols]: Adagrad sum, Adam moments; re-sharded like the weight
PER_ROW = "per_row"  # [num_rows]: row-wise Adagrad; column shards are merged by a width-weighted mean
SCALAR = "scalar"  # [1]: Adam's step; the same on every shard
STATE_KINDS = (PER_ELEMENT, PER_ROW, SCALAR)
ROW_COUNTS = "row_counts"  # a table's lookup counts: stored like a per-row state, beside the optimizer's


def rank_file(rank: int) -> str:
    return f"rank_{rank}.safetensors"


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str, where: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{where}: unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class ShardEntry:
    """One stored rectangle of a table: rows ``[row_offset, +num_rows)``, cols ``[col_offset, +num_cols)``.

    ``shape`` is the stored tensor's shape (``[num_rows, num_cols]`` for weights; see the state kinds).
    """

    file: str
    tensor: str
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    shape: tuple[int, ...]
    rank: int

    @property
    def row_end(self) -> int:
        return self.row_offset + self.num_rows

    @property
    def col_end(self) -> int:
        return self.col_offset + self.num_cols


@dataclass
class StateEntry:
    """A table-shaped tensor (the weight or one optimizer state) as its stored shards."""

    kind: str
    dtype: str
    shards: list[ShardEntry] = field(default_factory=list)


@dataclass
class TableEntry:
    """One table: where it sits in the model, its global shape, its weight and optimizer state."""

    collection: str
    name: str
    global_shape: tuple[int, int]
    sharding_type: str
    weight: StateEntry
    optimizer_state: dict[str, StateEntry] = field(default_factory=dict)
    row_counts: StateEntry | None = None  # per-row int32 lookup counts, where training counted them

    def stored_states(self) -> list[tuple[str, StateEntry]]:
        """Every table-shaped tensor stored for the table, by name: weight, optimizer states, row counts."""
        counts = [(ROW_COUNTS, self.row_counts)] if self.row_counts is not None else []
        return [("weight", self.weight), *self.optimizer_state.items(), *counts]


@dataclass(frozen=True)
class DenseEntry:
    """One dense tensor in ``dense.safetensors``."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int


@dataclass
class Manifest:
    """Everything ``manifest.json`` says. ``tables`` is keyed by the weight's state-dict name."""

    step: int
    world_size: int
    tables: dict[str, TableEntry]
    dense_params: dict[str, DenseEntry]
    files: dict[str, FileEntry]
    collections: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    model_config: dict[str, Any] | None = None
    prediction_prefix: str = ""
    dense_optimizer: Any = None
    rng: dict[str, dict[str, str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    data_position: dict[str, Any] | None = None
    created_unix: float = 0.0
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True, allow_nan=True)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Manifest:
        """Parse and check a manifest; CheckpointError naming ``where`` and the key path of a bad field."""
        if not isinstance(data, dict):
            raise CheckpointError(f"{where}: expected a JSON object")
        version = _get(data, "format_version", int, where)
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{where}: format_version {version} is not supported (this rectrain reads {FORMAT_VERSION})"
            )
        tables = {
            key: _table(entry, f"{where}: tables[{key!r}]")
            for key, entry in _get(data, "tables", dict, where).items()
        }
        dense = {
            key: DenseEntry(
                tensor=_get(e, "tensor", str, f"{where}: dense_params[{key!r}]"),
                shape=tuple(_get(e, "shape", list, f"{where}: dense_params[{key!r}]")),
                dtype=_get(e, "dtype", str, f"{where}: dense_params[{key!r}]"),
            )
            for key, e in _get(data, "dense_params", dict, where).items()
        }
        files = {
            name: FileEntry(_get(e, "sha256", str, f"{where}: files[{name!r}]"), _get(e, "bytes", int, where))
            for name, e in _get(data, "files", dict, where).items()
        }
        return cls(
            step=_get(data, "step", int, where),
            world_size=_get(data, "world_size", int, where),
            tables=tables,
            dense_params=dense,
            files=files,
            collections=_get(data, "collections", dict, where),
            plan=data.get("plan"),
            model_config=data.get("model_config"),
            prediction_prefix=_get(data, "prediction_prefix", str, where),
            dense_optimizer=data.get("dense_optimizer"),
            rng=_get(data, "rng", dict, where),
            extra=_get(data, "extra", dict, where),
            data_position=_optional(data, "data_position", dict, where),
            created_unix=float(data.get("created_unix", 0.0)),
            format_version=version,
        )


def _get(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise CheckpointError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointError(f"{where}: field {key!r} must be {kind.__name__}, got {value!r:.80}")
    return value


def _optional(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """``data[key]`` checked like ``_get``, or None when absent (a field newer than some checkpoints)."""
    return _get(data, key, kind, where) if data.get(key) is not None else None


def _shard(data: Any, where: str) -> ShardEntry:
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected an object")
    ints = {
        k: _get(data, k, int, where) for k in ("row_offset", "num_rows", "col_offset", "num_cols", "rank")
    }
    return ShardEntry(
        file=_get(data, "file", str, where),
        tensor=_get(data, "tensor", str, where),
        shape=tuple(_get(data, "shape", list, where)),
        **ints,
    )


def _state(data: Any, where: str) -> StateEntry:
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected an object")
    kind = _get(data, "kind", str, where)
    if kind not in STATE_KINDS:
        raise CheckpointError(f"{where}: kind must be one of {STATE_KINDS}, got {kind!r}")
    shards = [_shard(s, f"{where}.shards[{i}]") for i, s in enumerate(_get(data, "shards", list, where))]
    return StateEntry(kind=kind, dtype=_get(data, "dtype", str, where), shards=shards)


def _table(data: Any, where: str) -> TableEntry:
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected an object")
    shape = _get(data, "global_shape", list, where)
    if len(shape) != 2 or not all(isinstance(v, int) and v > 0 for v in shape):
        raise CheckpointError(f"{where}: global_shape must be [rows, cols] of positive ints, got {shape}")
    return TableEntry(
        collection=_get(data, "collection", str, where),
        name=_get(data, "name", str, where),
        global_shape=(shape[0], shape[1]),
        sharding_type=_get(data, "sharding_type", str, where),
        weight=_state(_get(data, "weight", dict, where), f"{where}.weight"),
        optimizer_state={
            name: _state(entry, f"{where}.optimizer_state[{name!r}]")
            for name, entry in _get(data, "optimizer_state", dict, where).items()
        },
        row_counts=(
            _state(data[ROW_COUNTS], f"{where}.{ROW_COUNTS}") if data.get(ROW_COUNTS) is not None else None
        ),
    )


def resolve_step_dir(path: str | Path, step: int | None = None) -> Path:
    """The step directory to read: ``path`` itself if it holds a manifest, else ``path/step_<step>`` or the
    one ``path/latest`` names. CheckpointError naming what is missing."""
    path = Path(path)
    if step is None and (path / MANIFEST).is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if step is not None:
        chosen = path / step_dir_name(step)
        if not (chosen / MANIFEST).is_file():
            have = sorted(p.name for p in path.glob(f"{STEP_PREFIX}*") if (p / MANIFEST).is_file())
            raise CheckpointError(f"{chosen}: no checkpoint for step {step} (have {have})")
        return chosen
    pointer = path / LATEST
    if not pointer.is_file():
        raise CheckpointError(
            f"{path}: no {LATEST!r} file and no {MANIFEST}; is this a checkpoint directory?"
        )
    name = pointer.read_text().strip()
    chosen = path / name
    if not name.startswith(STEP_PREFIX) or "/" in name or not (chosen / MANIFEST).is_file():
        raise CheckpointError(f"{pointer} names {name!r}, which is not a complete checkpoint in {path}")
    return chosen


def read_manifest(path: str | Path, step: int | None = None) -> Manifest:
    """The manifest of the checkpoint at ``path`` (a root with ``latest``, or a step directory)."""
    step_dir = resolve_step_dir(path, step)
    file = step_dir / MANIFEST
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read the manifest ({e})") from None
    return Manifest.from_dict(data, str(file))
