"""``write_delta``: publish the rows and dense state a trainer changed, as delta SEQ of base package N.

The rows are quantized exactly as ``recserve export`` quantizes a table (``quantize_table`` then
``kernel_rows``; row-wise, so a row's bytes depend on that row alone and equal a full export's bytes for it),
the dense state is converted as export converts it. The delta is written into a dot-named staging directory
of the publish directory, fsynced and renamed into place, so a follower never sees half of one. Layout and
reading: ``recserve.runtime.delta``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from recserve.errors import ExportError, PackageError
from recserve.export.quantize import quantize_kernel_rows
from recserve.runtime.delta import (
    DELTA_FORMAT,
    DELTA_FORMAT_VERSION,
    DENSE_FILE,
    MANIFEST_FILE,
    ROWS_FILE,
    delta_dir,
    manifest_sha256,
)
from recserve.runtime.dense_precision import DENSE_DTYPES
from recserve.runtime.layout import row_bytes
from recserve.runtime.package import (
    PackageManifest,
    StoredTensor,
    TableEntry,
    check_safetensors_file,
    read_manifest,
)
from rectrain.durable import follow_umask, fsync_path
from rectrain.safetensors_io import save_tensors

__all__ = ["delta_dir", "write_delta"]


def write_delta(
    publish_dir: str | Path,
    base_version: str,
    sequence: int,
    step: int,
    rows: Mapping[str, tuple[Tensor, Tensor]],
    dense_state: Mapping[str, Tensor],
    *,
    wall_time: float | None = None,
) -> Path:
    """Write delta ``sequence`` of base ``DIR/<base_version>`` and return its directory.

    Args:
        rows: table -> (ids int64 [n], fp32 rows [n, dim]): the rows changed since delta ``sequence - 1``
            (ids in any order, unique). Tables not named are unchanged. The rows may instead be the kernel
            rows ``quantize_table`` then ``kernel_rows`` make of them in the base's dtype (uint8 [n, row
            bytes]), written as they are.
        dense_state: the whole dense state (prediction-module names, as trained).
        wall_time: when the step's rows were read (unix seconds; default now).

    ExportError naming the table or field on anything the base does not fit (unknown table, wrong dim, ids
    out of range or repeated, dense entries missing or of another shape) or an existing delta ``sequence``.
    """
    base_dir = Path(publish_dir) / str(base_version)
    try:
        base, base_sha256, base_dense = _base_of(base_dir)
    except PackageError as error:
        raise ExportError(f"write_delta: base_version {base_version!r}: {error}") from None
    if base.version != str(base_version):
        raise ExportError(
            f"{base_dir}: its manifest's version is {base.version!r}; a base in a publish directory lives in "
            "the folder named by its version"
        )
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
        raise ExportError(f"write_delta: sequence must be an integer >= 1, got {sequence!r}")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ExportError(f"write_delta: step must be an integer, got {step!r}")
    target = delta_dir(publish_dir, str(base_version), sequence)
    if target.exists():
        raise ExportError(f"{target}: delta {sequence} of base {base_version} is already published")
    tensors, counts = {}, {}
    for table in base.tables:
        ids, quantized = _quantized_rows(table, rows.get(table.name))
        counts[table.name] = int(ids.numel())
        if ids.numel():
            tensors[f"{table.name}.ids"], tensors[f"{table.name}.rows"] = ids, quantized
    unknown = sorted(set(rows) - {t.name for t in base.tables})
    if unknown:
        raise ExportError(
            f"rows: unknown table {unknown[0]!r}; the base's tables are {[t.name for t in base.tables]}"
        )
    dense = _dense(base_dense, base, dense_state)
    manifest = {
        "format": DELTA_FORMAT,
        "format_version": DELTA_FORMAT_VERSION,
        "model_name": base.model_name,
        "base_version": base.version,
        "base_manifest_sha256": base_sha256,
        "sequence": sequence,
        "step": step,
        "wall_time": float(time.time() if wall_time is None else wall_time),
        "tables": {t.name: {"dtype": t.dtype.value, "rows": counts[t.name]} for t in base.tables},
    }
    return _publish(Path(publish_dir), target, manifest, tensors, dense)


def _base_of(base_dir: Path) -> tuple[PackageManifest, str, dict[str, StoredTensor]]:
    """The base's manifest, its sha256 and its dense file's tensor specs: read once per base (a trainer
    writes many deltas of one), again when its manifest file is replaced."""
    try:
        stat = (base_dir / MANIFEST_FILE).stat()
    except OSError:
        return read_manifest(base_dir), "", {}  # read_manifest names the missing file
    return _base_read(str(base_dir), (stat.st_ino, stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _base_read(
    base_dir: str, stamp: tuple[int, int, int]
) -> tuple[PackageManifest, str, dict[str, StoredTensor]]:
    manifest = read_manifest(base_dir)
    return manifest, manifest_sha256(base_dir), check_safetensors_file(Path(base_dir) / DENSE_FILE)


def _quantized_rows(table: TableEntry, changed: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """``(sorted ids, kernel rows)`` of ``table``'s changed rows, checked against the base."""
    if changed is None:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.uint8)
    ids, weight = changed
    where = f"rows[{table.name!r}]"
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ExportError(f"{where}: ids must be a 1-D integer tensor, got {ids.dtype} {list(ids.shape)}")
    quantized = weight.dtype == torch.uint8  # kernel rows already (the trainer quantizes where rows live)
    width = row_bytes(table.embedding_dim, table.dtype) if quantized else table.embedding_dim
    if weight.dim() != 2 or weight.shape != (ids.numel(), width):
        kind = "kernel row of the base's dtype" if quantized else "row of the table's dim"
        raise ExportError(
            f"{where}: rows must be [{ids.numel()}, {width}] (one {kind} per id), got {list(weight.shape)}"
        )
    ids = ids.detach().to("cpu", torch.int64)
    if ids.numel() == 0:
        return ids, torch.empty(0, dtype=torch.uint8)
    if int(ids.min()) < 0 or int(ids.max()) >= table.num_embeddings:
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ExportError(f"{where}: id {bad} is outside the table's rows [0, {table.num_embeddings})")
    weight = weight.detach().to("cpu")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):  # the trainer's ids come sorted: no copy
        ids, order = torch.sort(ids)
        if bool((ids[1:] == ids[:-1]).any()):
            repeated = int(ids[1:][ids[1:] == ids[:-1]][0])
            raise ExportError(f"{where}: id {repeated} appears more than once")
        weight = weight.index_select(0, order)
    return ids, weight if quantized else quantize_kernel_rows(weight, table.dtype)


def _dense(
    stored: Mapping[str, StoredTensor], base: PackageManifest, dense_state: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The dense state as export stores it, after checking names and shapes against the base's (``stored``:
    the base's dense tensors)."""
    missing = sorted(set(stored) - set(dense_state))
    unexpected = sorted(set(dense_state) - set(stored))
    if missing or unexpected:
        raise ExportError(
            f"dense_state: must hold exactly the base's dense entries (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    for key, spec in stored.items():
        if tuple(dense_state[key].shape) != tuple(spec.shape):
            raise ExportError(
                f"dense_state[{key!r}]: shape {list(dense_state[key].shape)}, the base has {list(spec.shape)}"
            )
    dtype = DENSE_DTYPES[base.dense_dtype]
    return {k: dense_state[k].detach().to("cpu", dtype).contiguous() for k in stored}


def _publish(
    publish_dir: Path,
    target: Path,
    manifest: dict,
    tensors: dict[str, Tensor],
    dense: dict[str, Tensor],
) -> Path:
    """Write the files into ``DIR/.<name>`` with their checksums, fsync, and rename into ``target``."""
    staging = publish_dir / f".{target.parent.name}-{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        files = {}
        for name, content in ((ROWS_FILE, tensors), (DENSE_FILE, dense)):
            path, digest = staging / name, hashlib.sha256()
            save_tensors(path, content, {"format": "pt"}, digest)  # hashed as written: one pass
            follow_umask(path)
            fsync_path(path)
            files[name] = {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}
        manifest_path = staging / MANIFEST_FILE
        manifest_path.write_text(json.dumps({**manifest, "files": files}, indent=1) + "\n")
        follow_umask(manifest_path)
        fsync_path(manifest_path)
        fsync_path(staging)
        target.parent.mkdir(exist_ok=True)
        fsync_path(publish_dir)
        os.replace(staging, target)
        fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
