"""Model deltas: the rows and dense state a trainer changed since the previous delta of a base package.

    DIR/<N>/                       base package N (manifest "version" == "N")
    DIR/<N>-deltas/<SEQ:08d>/      delta SEQ of base N: manifest.json, rows.safetensors, dense.safetensors
    DIR/.<anything>                a writer's staging (ignored)

A delta names its base exactly (``base_version`` and the sha256 of the base's manifest bytes) and its place
in the stream (``sequence``); its rows are kernel rows quantized as export quantizes them, so applying deltas
1..k to base N serves bit for bit what a full export of the same weights serves. This module reads and
verifies; ``recserve.export.delta`` writes; ``Predictor.apply_delta`` serves. Format: docs/package-format.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from recserve.errors import PackageError
from recserve.runtime.dense_precision import DENSE_DTYPES
from recserve.runtime.layout import row_bytes
from recserve.runtime.package import (
    DENSE_FILE,
    MANIFEST_FILE,
    PackageManifest,
    check_safetensors_file,
    verify_listed_files,
)
from rectrain.durable import sha256_file
from rectrain.safetensors_io import SafetensorsFormatError, dtype_name, tensors_of_bytes

DELTA_FORMAT = "recserve-model-delta"
DELTA_FORMAT_VERSION = 1
ROWS_FILE = "rows.safetensors"
DELTA_FILES = (ROWS_FILE, DENSE_FILE)
_SEQ_DIGITS = 8


def deltas_dir(publish_dir: str | Path, base_version: str) -> Path:
    """``DIR/<N>-deltas``: where the deltas of base ``N`` go."""
    return Path(publish_dir) / f"{base_version}-deltas"


def delta_dir(publish_dir: str | Path, base_version: str, sequence: int) -> Path:
    """``DIR/<N>-deltas/<SEQ>``, SEQ zero-padded to 8 digits (so names sort as numbers do)."""
    return deltas_dir(publish_dir, base_version) / f"{sequence:0{_SEQ_DIGITS}d}"


def manifest_sha256(package_dir: str | Path) -> str:
    """The sha256 of a package's manifest bytes: what a delta names its base by."""
    return sha256_file(Path(package_dir) / MANIFEST_FILE)


@dataclass(frozen=True)
class Delta:
    """A verified delta: ``rows`` maps each changed table to (sorted unique global ids int64 [n], kernel rows
    uint8 [n, row bytes]); ``dense`` is the whole dense state, in the base's dense dtype."""

    base_version: str
    sequence: int
    step: int
    wall_time: float
    rows: dict[str, tuple[Tensor, Tensor]]
    dense: dict[str, Tensor]
    model_name: str = ""
    base_manifest_sha256: str = ""
    path: Path | None = field(default=None, compare=False)
    first_sequence: int | None = None  # a fold of deltas first_sequence..sequence (None: this one alone)

    @property
    def num_rows(self) -> int:
        return sum(ids.numel() for ids, _ in self.rows.values())

    @property
    def starts_at(self) -> int:
        """The first delta this one holds: its own sequence, or a fold's first."""
        return self.sequence if self.first_sequence is None else self.first_sequence


def fold_deltas(deltas: Sequence[Delta]) -> Delta:
    """One delta that applies as ``deltas`` (consecutive deltas of one base, each verified) in order: each
    table's rows changed by any, the newest bytes of a row changed by several, the last one's dense state
    and place in the stream. One sort per table over all their rows, so folding k deltas costs their size
    (a follower starting on a base with many deltas, or catching up, applies them as one)."""
    for older, newer in zip(deltas, deltas[1:]):
        if newer.base_version != older.base_version or newer.starts_at != older.sequence + 1:
            raise PackageError(
                f"cannot fold delta {newer.sequence} of base {newer.base_version} onto delta "
                f"{older.sequence} of base {older.base_version}"
            )
    if len(deltas) == 1:
        return deltas[0]
    rows = {}
    for table in dict.fromkeys(t for d in deltas for t in d.rows):
        parts = [d.rows[table] for d in deltas if table in d.rows]
        all_ids = torch.cat([ids for ids, _ in parts])
        order = torch.argsort(all_ids, stable=True)  # of equal ids, the newest comes last
        sorted_ids = all_ids.index_select(0, order)
        last = torch.ones_like(sorted_ids, dtype=torch.bool)
        last[:-1] = sorted_ids[1:] != sorted_ids[:-1]
        kept = order.masked_select(last)  # index_select, not []: GIL-free while a worker serves
        rows[table] = (all_ids.index_select(0, kept), torch.cat([r for _, r in parts]).index_select(0, kept))
    return dataclasses.replace(deltas[-1], rows=rows, first_sequence=deltas[0].starts_at)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_delta(
    path: str | Path, base: PackageManifest, base_manifest_sha256: str, expected_sequence: int
) -> Delta:
    """Read and verify the delta at ``path`` as delta ``expected_sequence`` of ``base`` (whose manifest bytes
    hash to ``base_manifest_sha256``). Every refusal is a PackageError naming the file and the field."""
    path = Path(path)
    where = path / MANIFEST_FILE
    data = _read_json(where)
    _check_identity(data, where, base, base_manifest_sha256, expected_sequence)
    if _is_number(path.name) and int(path.name) != data["sequence"]:
        raise PackageError(f"{where}: sequence {data['sequence']} but the folder is named {path.name!r}")
    counts = _table_counts(data.get("tables"), where, base)
    files = data.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(DELTA_FILES):
        listed = sorted(files) if isinstance(files, dict) else files
        raise PackageError(f"{where}: files: expected exactly {sorted(DELTA_FILES)}, got {listed!r}")
    verify_listed_files(path, files, hashes=False)  # each file is hashed as it is read (``_load``)
    return Delta(
        base_version=base.version,
        sequence=data["sequence"],
        step=data["step"],
        wall_time=float(data["wall_time"]),
        rows=_read_rows(path / ROWS_FILE, base, counts, files[ROWS_FILE]["sha256"]),
        dense=_read_dense(path / DENSE_FILE, base, files[DENSE_FILE]["sha256"]),
        model_name=base.model_name,
        base_manifest_sha256=base_manifest_sha256,
        path=path,
    )


def _read_json(where: Path) -> dict[str, Any]:
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        raise PackageError(f"{where}: missing; a delta needs its manifest.json") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise PackageError(f"{where}: not a readable JSON manifest ({error})") from None
    if not isinstance(data, dict) or data.get("format") != DELTA_FORMAT:
        raise PackageError(f"{where}: format: not a recserve model delta (expected {DELTA_FORMAT!r})")
    if data.get("format_version") != DELTA_FORMAT_VERSION:
        raise PackageError(
            f"{where}: format_version {data.get('format_version')!r} is not supported (reads "
            f"{DELTA_FORMAT_VERSION}); publish the delta with this recserve's writer"
        )
    return data


def _check_identity(
    data: dict[str, Any], where: Path, base: PackageManifest, sha256: str, expected_sequence: int
) -> None:
    """The delta is the next one of exactly this base, of this model."""
    if data.get("model_name") != base.model_name:
        raise PackageError(
            f"{where}: model_name {data.get('model_name')!r}, the base serves {base.model_name!r}"
        )
    if data.get("base_version") != base.version:
        raise PackageError(
            f"{where}: base_version {data.get('base_version')!r}, the base is {base.version!r}"
        )
    if data.get("base_manifest_sha256") != sha256:
        raise PackageError(
            f"{where}: base_manifest_sha256 {data.get('base_manifest_sha256')!r} does not name the base "
            f"being served (its manifest hashes to {sha256}): a delta of another export of version "
            f"{base.version}"
        )
    sequence = data.get("sequence")
    if not _is_int(sequence) or sequence != expected_sequence:
        raise PackageError(
            f"{where}: sequence {sequence!r}, expected {expected_sequence} (deltas apply in order, no gaps)"
        )
    if not _is_int(data.get("step")):
        raise PackageError(f"{where}: step {data.get('step')!r} is not an integer")
    wall_time = data.get("wall_time")
    if not (
        isinstance(wall_time, (int, float)) and not isinstance(wall_time, bool) and math.isfinite(wall_time)
    ):
        raise PackageError(f"{where}: wall_time {wall_time!r} is not a finite number of seconds")


def _table_counts(tables: Any, where: Path, base: PackageManifest) -> dict[str, int]:
    """``{table: changed rows}`` from the manifest's ``tables``, each a table of the base, with its dtype."""
    if not isinstance(tables, dict):
        raise PackageError(
            f"{where}: tables: expected {{table: {{'dtype', 'rows'}}}}, got {type(tables).__name__}"
        )
    known = {t.name: t for t in base.tables}
    counts = {}
    for name, entry in tables.items():
        if name not in known:
            raise PackageError(f"{where}: tables[{name!r}]: the base has no such table ({sorted(known)})")
        if not isinstance(entry, dict) or entry.get("dtype") != known[name].dtype.value:
            got = entry.get("dtype") if isinstance(entry, dict) else entry
            raise PackageError(
                f"{where}: tables[{name!r}].dtype {got!r}, the base stores it as {known[name].dtype.value!r}"
            )
        rows = entry.get("rows")
        if not _is_int(rows) or rows < 0:
            raise PackageError(f"{where}: tables[{name!r}].rows {rows!r} is not a row count")
        counts[name] = rows
    return counts


def _read_rows(
    path: Path, base: PackageManifest, counts: dict[str, int], sha256: str
) -> dict[str, tuple[Tensor, Tensor]]:
    """The changed rows, after checking the header against the base (names, dtypes, widths) and the ids
    (sorted, unique, inside their tables)."""
    stored = check_safetensors_file(path)
    expected = {}
    for name, n in counts.items():
        if n:
            entry = base.table(name)
            expected[f"{name}.ids"] = ("I64", (n,))
            expected[f"{name}.rows"] = ("U8", (n, row_bytes(entry.embedding_dim, entry.dtype)))
    unexpected = sorted(set(stored) - set(expected))
    if unexpected:
        raise PackageError(f"{path}: tensor {unexpected[0]!r} is not listed in the manifest's tables")
    for key, (dtype, shape) in expected.items():
        if key not in stored:
            raise PackageError(f"{path}: has no tensor {key!r} (the manifest's tables list its rows)")
        got = stored[key]
        if got.dtype != dtype or tuple(got.shape) != shape:
            raise PackageError(
                f"{path}: {key}: {got.dtype} {list(got.shape)}, the base's table needs {dtype} {list(shape)}"
            )
    tensors = _load(path, sha256)
    rows = {}
    for name, n in counts.items():
        if not n:
            continue
        ids = tensors[f"{name}.ids"]
        limit = base.table(name).num_embeddings
        if n > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise PackageError(f"{path}: {name}.ids: not sorted and unique")
        if int(ids[0]) < 0 or int(ids[-1]) >= limit:
            bad = int(ids[0]) if int(ids[0]) < 0 else int(ids[-1])
            raise PackageError(f"{path}: {name}.ids: id {bad} is outside the table's rows [0, {limit})")
        rows[name] = (ids, tensors[f"{name}.rows"])
    return rows


def _read_dense(path: Path, base: PackageManifest, sha256: str) -> dict[str, Tensor]:
    """The dense state, every tensor in the base's dense dtype (``Predictor.apply_delta`` checks names and
    shapes against the model)."""
    stored = check_safetensors_file(path)
    want = DENSE_DTYPES.get(base.dense_dtype)
    if want is None:
        raise PackageError(
            f"{path}: the base's dense_dtype {base.dense_dtype!r} is not one of {list(DENSE_DTYPES)}"
        )
    for key, spec in stored.items():
        if spec.dtype != dtype_name(want):
            raise PackageError(
                f"{path}: {key}: dtype {spec.dtype}, the base's dense part is {base.dense_dtype}"
            )
    return _load(path, sha256)


def _load(path: Path, sha256: str) -> dict[str, Tensor]:
    """The tensors, parsed from one read of the file's bytes, which must hash to the manifest's ``sha256``
    (the only hash of a delta's files: ``verify_listed_files`` checks names and sizes only): never mapped (a
    file truncated under a mapping ends the reading process with SIGBUS) and never read twice (the bytes
    loaded are the bytes verified). The tensors are views of the bytes read: reading and
    hashing release the GIL, and no copy holds it while the worker serves."""
    try:
        with open(path, "rb") as file:
            data = bytearray(os.fstat(file.fileno()).st_size)
            got = file.readinto(data)
    except OSError as error:
        raise PackageError(f"{path}: cannot be read ({error.strerror or error})") from None
    if got != len(data):
        raise PackageError(f"{path}: changed while it was read ({got} of {len(data)} bytes)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise PackageError(
            f"{path}: sha256 {digest} does not match {MANIFEST_FILE} ({sha256}); the file is corrupt or was "
            "changed after it was written"
        )
    try:
        return tensors_of_bytes(data, path)
    except SafetensorsFormatError as error:
        raise PackageError(str(error)) from None  # it names the file and the field


def list_stream(publish_dir: str | Path) -> tuple[Path | None, list[Path]]:
    """``(newest base DIR/<N> by number, its deltas DIR/<N>-deltas/<SEQ> in sequence order)``.

    Only complete entries are visible (writers stage under dot-names and rename into place); a directory
    that vanishes while listing (a retired base) is skipped, a missing ``publish_dir`` lists nothing."""
    bases = [(int(p.name), p) for p in _entries(Path(publish_dir)) if _is_number(p.name)]
    bases = [(n, p) for n, p in bases if (p / MANIFEST_FILE).is_file()]
    if not bases:
        return None, []
    _, base = max(bases)
    deltas = [
        (int(p.name), p)
        for p in _entries(deltas_dir(publish_dir, base.name))
        if len(p.name) == _SEQ_DIGITS and _is_number(p.name)
    ]
    return base, [p for _, p in sorted(deltas)]


def _is_number(name: str) -> bool:
    return name.isascii() and name.isdigit()


def _entries(directory: Path) -> list[Path]:
    """The sub-directories of ``directory`` not named with a dot; none if it vanished."""
    try:
        names = [p for p in directory.iterdir() if not p.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [p for p in names if p.is_dir()]
