"""Tables on local disk: a TBE's weight and optimizer-state buffers memory-mapped from files.

A table with ``storage = "disk"`` keeps its rows and the fused optimizer's state of each row in files under
``DiskTablesSettings.dir`` instead of anonymous memory. The files are mapped ``MAP_SHARED`` and handed to
FBGEMM as the TBE's host buffers (its ``preallocated_host_buffers``), so the lookup and the fused update run
the same kernels on the same addresses as for a table in RAM: the results are bitwise the same, and the
page cache is the hot-row cache. File-backed pages are reclaimable, so a memory cap (a cgroup limit) evicts
cold rows to disk instead of killing the process; ``cache_bytes`` additionally bounds the table's resident
pages from inside the process (``DiskBuffers.trim``, checked once a step), for runs without a cgroup cap.

The files are working storage, not a record: they are created empty (sparse zeros, which is the optimizer's
initial state) for each kernel, deleted when it is released, and never read back after a restart. What a
crash must leave valid is the last checkpoint, which the checkpoint writer saves to its own files
(``rectrain.checkpoint``); a run resumes by loading it into fresh mapped buffers.
See docs/disk-tables.md for when to use them and what they cost.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)

STORAGE_KINDS = ("ram", "disk")
_PAGE = mmap.PAGESIZE


@dataclass
class DiskTablesSettings:
    """Where disk tables keep their files and how much of them may stay resident.

    ``dir``: a directory on local disk (default ``$RECTRAIN_DISK_TABLES_DIR``, else ``<tmp>/rectrain-disk-
    tables``); each process makes its own sub-directory there and removes it when its tables are released.
    ``cache_bytes``: resident bytes allowed per disk kernel before cold pages are written out and dropped
    (None: no in-process bound; the page cache, bounded by the process's memory cap, is the cache).
    """

    dir: str | None = None
    cache_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.cache_bytes is not None and (not isinstance(self.cache_bytes, int) or self.cache_bytes < 0):
            raise ConfigError(f"disk tables cache_bytes must be an int >= 0, got {self.cache_bytes!r}")

    def base_dir(self) -> Path:
        chosen = self.dir or os.environ.get("RECTRAIN_DISK_TABLES_DIR")
        return Path(chosen) if chosen else Path(tempfile.gettempdir()) / "rectrain-disk-tables"


_settings = DiskTablesSettings()
_lock = threading.Lock()


def configure(settings: DiskTablesSettings) -> None:
    """Set where kernels built from now on keep their disk tables (the trainer calls this from
    ``train.disk_tables_dir`` / ``train.disk_cache_mb``)."""
    global _settings
    _settings = settings


def settings() -> DiskTablesSettings:
    return _settings


def check_storage(storage: str, where: str) -> str:
    """``storage`` lower-cased, or a ConfigError naming ``where`` and the choices."""
    value = storage.lower() if isinstance(storage, str) else storage
    if value not in STORAGE_KINDS:
        raise ConfigError(f"{where}: storage must be one of {', '.join(STORAGE_KINDS)}; got {storage!r}")
    return value


def _process_dir(base: Path) -> Path:
    """This process's directory under ``base``; directories of processes that are gone are removed first
    (a killed run leaves its working files behind; nothing reads them again)."""
    base.mkdir(parents=True, exist_ok=True)
    for stale in base.glob("pid-*"):
        pid = stale.name.split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    mine = base / f"pid-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    return mine


class _Mapping:
    """One file mapped shared and read-write, as a flat tensor of ``numel`` values."""

    def __init__(self, path: Path, numel: int, dtype: torch.dtype) -> None:
        self.path = path
        nbytes = max(1, numel * torch.empty(0, dtype=dtype).element_size())
        # O_TRUNC: always a fresh sparse file of zeros; stale contents must never leak into a new kernel.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.map = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # A step reads scattered rows: the kernel's read-around on a fault (32 pages) would fill the cache
        # with neighbours no batch asked for and evict the hot rows; one page per fault is the right read.
        self.map.madvise(mmap.MADV_RANDOM)
        self.nbytes = nbytes
        self.tensor = (
            torch.frombuffer(self.map, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        )

    def resident_bytes(self) -> int:
        if not self.tensor.numel():
            return 0
        pages = -(-self.nbytes // _PAGE)
        vec = np.zeros(pages, np.uint8)
        pointer = vec.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))
        if _libc.mincore(ctypes.c_void_p(self.tensor.data_ptr()), ctypes.c_size_t(self.nbytes), pointer):
            raise OSError(ctypes.get_errno(), f"mincore on {self.path} failed")
        return int(np.count_nonzero(vec & 1)) * _PAGE  # low bit: the page is resident

    def page_out(self) -> None:
        """Write dirty pages back, then drop every page of the file from this mapping and the page cache.

        Measured (Linux 6.18): ``MADV_PAGEOUT`` left a shared file mapping's pages resident, clean or dirty;
        ``msync`` + ``MADV_DONTNEED`` + ``POSIX_FADV_DONTNEED`` drops them, and never loses a write (the
        mapping is shared: ``MADV_DONTNEED`` only unmaps, and the page cache drops clean pages only)."""
        self.map.flush()
        self.map.madvise(mmap.MADV_DONTNEED)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))


class DiskBuffers:
    """The mapped host buffers of one disk TBE: ``{buffer name: flat tensor}``, each in its own file.

    Args:
        label: names the files (``<label>.<buffer>``), e.g. the kernel's tables.
        sizes: ``{buffer name: (number of values, dtype)}``.
        cache_bytes: resident bytes allowed over all buffers (None: unbounded; see ``trim``).
    """

    def __init__(
        self, label: str, sizes: dict[str, tuple[int, torch.dtype]], cache_bytes: int | None = None
    ) -> None:
        with _lock:
            directory = _process_dir(_settings.base_dir())
        stem = f"{_safe(label)}-{uuid.uuid4().hex[:8]}"
        self.cache_bytes = cache_bytes if cache_bytes is not None else _settings.cache_bytes
        self._maps = {name: _Mapping(directory / f"{stem}.{name}", n, dt) for name, (n, dt) in sizes.items()}
        self.paths = [m.path for m in self._maps.values()]
        self.trims = 0
        # The files go with the kernel: when it is collected (or the process exits normally) they are removed.
        self._finalizer = weakref.finalize(self, _remove, list(self.paths))

    def __getitem__(self, name: str) -> Tensor:
        return self._maps[name].tensor

    def tensors(self) -> dict[str, Tensor]:
        return {name: m.tensor for name, m in self._maps.items()}

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self._maps.values())

    def resident_bytes(self) -> int:
        """Bytes of the buffers now in memory (``mincore``)."""
        return sum(m.resident_bytes() for m in self._maps.values())

    def trim(self) -> bool:
        """If more than ``cache_bytes`` are resident, write dirty pages back, drop them all; whether it did.

        Coarse on purpose: the hot rows come back from disk on their next touch, and a per-page LRU is what
        the kernel's own reclaim under a cgroup cap already is (the better bound where a cap can be set)."""
        if self.cache_bytes is None or self.resident_bytes() <= self.cache_bytes:
            return False
        for m in self._maps.values():
            m.page_out()
        self.trims += 1
        return True


def _safe(label: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return cleaned[:80] or "tables"


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
