"""Write a model package atomically: files go to a temporary sibling directory, are fsynced and checksummed,
and the directory is renamed into place, so a reader (or a server watching the parent) never sees half a
package. Layout and names: ``recserve.runtime.package``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

from recserve.errors import ExportError
from recserve.runtime.layout import QuantizedTable
from recserve.runtime.package import (
    DENSE_FILE,
    MANIFEST_FILE,
    PackageManifest,
    embeddings_file,
    scale_bias_key,
    weights_key,
)
from recserve.runtime.placement import TableShard
from rectrain.durable import follow_umask, fsync_path, sha256_file


def _save(tensors: dict[str, Tensor], path: Path) -> dict[str, object]:
    """Save ``tensors`` as safetensors at ``path``; its manifest entry (sha256, bytes)."""
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    follow_umask(path)  # safetensors creates its files 0600
    fsync_path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def _shard_tensors(shards: Mapping[TableShard, QuantizedTable], device: str) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    for shard, table in shards.items():
        if shard.device != device:
            continue
        # A row range of a larger tensor is cloned: safetensors refuses tensors that share storage.
        tensors[weights_key(shard)] = table.weights.clone()
        if table.scale_bias is not None:
            tensors[scale_bias_key(shard)] = table.scale_bias.clone()
    return tensors


def write_package(
    out_dir: str | Path,
    manifest: PackageManifest,
    shards: Mapping[TableShard, QuantizedTable],
    dense_state: Mapping[str, Tensor],
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``manifest`` (its ``files`` filled in here), the shards per device and the dense state."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"{out}: exists and is not empty; choose a new directory or pass overwrite (--overwrite)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        files = {DENSE_FILE: _save(dict(dense_state), staging / DENSE_FILE)}
        for index, device in enumerate(manifest.placement.devices):
            tensors = _shard_tensors(shards, device)
            if tensors:
                files[embeddings_file(index)] = _save(tensors, staging / embeddings_file(index))
        manifest.files = files
        manifest_path = staging / MANIFEST_FILE
        manifest_path.write_text(json.dumps(manifest.to_dict(), indent=1) + "\n")
        fsync_path(manifest_path)
        fsync_path(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
        fsync_path(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
