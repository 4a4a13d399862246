"""Durable checkpoint files: safetensors and text written, fsynced and checksummed; atomic renames."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import Tensor

from rectrain.checkpoint.errors import CheckpointError
from rectrain.checkpoint.manifest import FileEntry
from rectrain.durable import follow_umask, fsync_path, sha256_file
from rectrain.safetensors_io import save_tensors


def sha256_of(path: Path) -> FileEntry:
    """sha256 and size of a file."""
    return FileEntry(sha256_file(path), path.stat().st_size)


def write_safetensors(path: Path, tensors: dict[str, Tensor]) -> FileEntry:
    """Write ``tensors`` (any device or layout: written from their own memory, a bounded chunk staged at most)
    to ``path``, fsync it, return its checksum and size."""
    save_tensors(path, tensors)
    follow_umask(path)
    return sha256_of(path)


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` directory to ``final`` (replacing an older ``final``), durably."""
    fsync_path(tmp)
    if final.exists():
        old = final.with_name(f".old_{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_path(final.parent)


def check_file(path: Path, expected: FileEntry, verify_checksum: bool) -> None:
    """CheckpointError naming ``path`` if it is missing, of the wrong size, or (optionally) wrong sha256."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the manifest lists it); the checkpoint is incomplete")
    size = path.stat().st_size
    if size != expected.bytes:
        raise CheckpointError(
            f"{path}: {size} bytes, the manifest records {expected.bytes} (truncated or replaced)"
        )
    if verify_checksum:
        actual = sha256_of(path).sha256
        if actual != expected.sha256:
            raise CheckpointError(
                f"{path}: sha256 {actual} does not match the manifest's {expected.sha256} "
                "(the file was altered)"
            )
