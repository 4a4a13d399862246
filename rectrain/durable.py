"""Files that survive a crash: fsync of files and directories, atomic text replacement, and checksums.

Shared by everything that writes what a user relies on later (plans, checkpoints, model packages). Files get
the permissions of the process umask like any file the user creates (``0644`` under the usual ``022``), so
that a job running as another user of the group (an export, a server) can read them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

_FILE_MODE = 0o666  # open() and creat() start here; the umask takes bits away
_CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk (directories: so a rename inside it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where Linux tells it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (momentarily visible to other threads)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give ``path`` the mode a newly created file gets under the umask (for writers that make files 0600)."""
    os.chmod(path, _FILE_MODE & ~current_umask())


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically: temp file in the same directory, fsync, rename, fsync dir."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
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
