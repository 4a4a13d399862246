"""A memory cap for benchmark worker processes: a child cgroup of this process's own, cgroup v2 or v1.

The cap is nested under the cgroup this process runs in (so whatever limits the machine already applies
still hold) and removed afterwards. Needs write access to the cgroup tree (root). Worker processes join it
themselves, first thing, with ``join(path)`` (before they allocate anything).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str | None) -> str:
    """This process's cgroup path for ``controller`` (v1) or the unified hierarchy (None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (
            controller is not None and controller in names.split(",")
        ):
            return path.lstrip("/")
    raise OSError(f"no cgroup of {controller or 'v2'} in /proc/self/cgroup")


def _v2_root() -> Path | None:
    for root in (_ROOT, _ROOT / "unified"):
        controllers = root / "cgroup.controllers"
        if controllers.is_file() and "memory" in controllers.read_text().split():
            return root
    return None


@dataclass
class MemoryCap:
    """A cgroup with a memory limit of ``limit_bytes``; ``version`` 1 or 2."""

    path: Path
    version: int
    limit_bytes: int

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryCap:
        root = _v2_root()
        if root is not None:
            parent = root / _own_path(None)
            path = parent / name
            path.mkdir(exist_ok=True)
            (path / "memory.max").write_text(str(limit_bytes))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")  # the cap must evict to the files, not to swap
            return cls(path, 2, limit_bytes)
        parent = _ROOT / "memory" / _own_path("memory")
        path = parent / name
        path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        if (path / "memory.memsw.limit_in_bytes").exists():
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        return cls(path, 1, limit_bytes)

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        """The cgroup's peak charge (page cache included), where the kernel reports it."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        file = self.path / name
        return int(file.read_text()) if file.exists() else 0

    def remove(self) -> None:
        for _ in range(50):  # a killed worker leaves the cgroup a moment after it is reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def join(path: str) -> None:
    """Move this process into the cgroup at ``path``."""
    (Path(path) / "cgroup.procs").write_text(str(os.getpid()))
