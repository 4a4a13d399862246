"""Files that survive a crash: fsync of files and directories, and atomic text replacement.

Shared by everything that writes what a user relies on later (plans, checkpoints, model packages).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk (directories: so a rename inside it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically: temp file in the same directory, fsync, rename, fsync dir."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
