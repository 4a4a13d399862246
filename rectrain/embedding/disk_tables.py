"""Tables on local disk: the files behind a disk TBE's hot-row cache.

A table with ``storage = "disk"`` keeps its rows and the fused optimizer's state of each row in files under
``DiskTablesSettings.dir`` instead of anonymous memory. The TBE itself holds only a bounded cache of rows
(``rectrain.embedding.disk_cache``, sized by ``cache_bytes`` or the planner's ``table_cache_bytes``); rows
move between it and these files whole. The files are mapped ``MAP_SHARED`` (``MADV_RANDOM``: a cache miss
reads one page, not the kernel's read-around), so their pages are page cache: reclaimable, written back by
the kernel under a memory cap instead of counting as the process's own memory.

The files are working storage, not a record: they are created empty (sparse zeros, which is the optimizer's
initial state) for each kernel, deleted when it is released, and never read back after a restart. What a
crash must leave valid is the last checkpoint, which the checkpoint writer saves to its own files
(``rectrain.checkpoint``) after the cache has written its rows back; a run resumes by loading it into fresh
files. See docs/disk-tables.md for when to use them and what they cost.
"""

from __future__ import annotations

import contextlib
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

import torch
from torch import Tensor

from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)

STORAGE_KINDS = ("ram", "disk")


@dataclass
class DiskTablesSettings:
    """Where disk tables keep their files and how large their RAM caches are.

    ``dir``: a directory on local disk (default ``$RECTRAIN_DISK_TABLES_DIR``, else ``<tmp>/rectrain-disk-
    tables``); each process makes its own sub-directory there and removes it when its tables are released.
    ``cache_bytes``: the row cache of each disk kernel (rows and their optimizer state), shared by its tables
    in proportion to their rows (None: ``disk_cache.DEFAULT_FRACTION`` of each table's rows).
    ``table_cache_bytes``: a cache per table name (the planner's memory plan); overrides ``cache_bytes``.
    """

    dir: str | None = None
    cache_bytes: int | None = None
    table_cache_bytes: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.cache_bytes is not None and (not isinstance(self.cache_bytes, int) or self.cache_bytes < 0):
            raise ConfigError(f"disk tables cache_bytes must be an int >= 0, got {self.cache_bytes!r}")
        for name, value in (self.table_cache_bytes or {}).items():
            if not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"disk tables table_cache_bytes[{name!r}] must be an int >= 0, got {value!r}"
                )

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


class DiskBuffers:
    """The mapped host buffers of one disk TBE: ``{buffer name: flat tensor}``, each in its own file.

    Args:
        label: names the files (``<label>.<buffer>``), e.g. the kernel's tables.
        sizes: ``{buffer name: (number of values, dtype)}``.
        cache_bytes: the kernel's row cache (None: the configured ``DiskTablesSettings.cache_bytes``).
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
        # The files go with the kernel: when it is collected (or the process exits normally) they are removed.
        self._finalizer = weakref.finalize(self, _remove, list(self.paths))

    def __getitem__(self, name: str) -> Tensor:
        return self._maps[name].tensor

    def tensors(self) -> dict[str, Tensor]:
        return {name: m.tensor for name, m in self._maps.items()}

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self._maps.values())


def _safe(label: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return cleaned[:80] or "tables"


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
