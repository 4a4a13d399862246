"""A kernel's base rows and a log of changed rows stitched into one range of virtual memory (Linux).

FBGEMM's CPU int-N kernel reads row ``r`` of table ``t`` at ``weights + offset[t] + r * width`` and only
checks ``r`` against the table's extent (up to the next table's offset). A :class:`Stitched` range lays out,
per table, the package file's pages holding its rows (mapped again, read-only, ``MAP_PRIVATE``: the same
page cache pages every worker maps, nothing copied) followed by anonymous pages for a log of changed rows. A
changed row is then just a larger row index of the same table, and the kernel reads base and changed rows in
place, in the bag's own order: exact, and as fast as the base (only the ids are remapped, see ``overlay``).

The log is append-only: a new version writes its rows into fresh slots, so the slots an older version
reads stay as they were while batches may still be scored on it. Untouched log pages cost no memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

_PAGE = mmap.PAGESIZE
_PROT_NONE, _PROT_READ, _PROT_WRITE = 0, 1, 2
_MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS = 0x02, 0x10, 0x20
_MAP_NORESERVE, _MAP_POPULATE = 0x4000, 0x8000
_FAILED = ctypes.c_void_p(-1).value


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBC = _libc()


@dataclass(frozen=True)
class BackingFile:
    """The file a buffer is a mapping of, kept open (a retired package's files may be unlinked later)."""

    fd: int
    offset: int  # the file offset of the buffer's first byte

    def __del__(self) -> None:
        os.close(self.fd)


def backing_file(buffer: Tensor) -> BackingFile | None:
    """The file ``buffer`` (a CPU tensor) maps, from ``/proc/self/maps``; None when it maps none (rows built
    in memory), the file is gone, or this is not Linux."""
    if _LIBC is None or buffer.device.type != "cpu" or buffer.numel() == 0:
        return None
    address = buffer.data_ptr()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    if len(fields) < 6 or not fields[5].startswith("/"):
                        return None
                    path, inode = fields[5].rstrip("\n"), int(fields[4])
                    if path.endswith(" (deleted)"):
                        return None
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    if os.fstat(fd).st_ino != inode or end < address + buffer.numel():
                        os.close(fd)
                        return None
                    return BackingFile(fd, int(fields[2], 16) + address - start)
    except (OSError, ValueError, IndexError):
        return None
    return None


class _Range:
    """A reserved range of virtual memory, unmapped whole when the last tensor over it is gone."""

    def __init__(self, size: int) -> None:
        assert _LIBC is not None
        address = _LIBC.mmap(None, size, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if address in (None, _FAILED):
            raise OSError(ctypes.get_errno(), f"cannot reserve {size} bytes of address space")
        self.address, self.size = address, size

    def map(self, at: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> None:
        assert _LIBC is not None and at % _PAGE == 0 and at + size <= self.size
        if size == 0:
            return
        got = _LIBC.mmap(self.address + at, size, prot, flags | _MAP_PRIVATE | _MAP_FIXED, fd, offset)
        if got != self.address + at:
            raise OSError(ctypes.get_errno(), "cannot map into a reserved range")

    def tensor(self) -> Tensor:
        array = (ctypes.c_uint8 * self.size).from_address(self.address)
        array.owner = self  # the tensor holds the array, the array holds the range
        return torch.frombuffer(array, dtype=torch.uint8)

    def __del__(self) -> None:
        if _LIBC is not None:
            _LIBC.munmap(self.address, self.size)


@dataclass(frozen=True)
class Stitched:
    """One kernel's tables as ``buffer`` (uint8): table ``t``'s base row ``r`` at byte ``starts[t] + r *
    widths[t]``, its log slot ``s`` as row ``first_slot[t] + s`` (``capacity[t]`` slots)."""

    buffer: Tensor
    starts: tuple[int, ...]
    widths: tuple[int, ...]
    first_slot: tuple[int, ...]
    capacity: tuple[int, ...]

    @classmethod
    def build(
        cls,
        source: BackingFile,
        offsets: list[int],
        rows: list[int],
        widths: list[int],
        capacity: list[int],
    ) -> Stitched:
        """Table ``t``'s base rows are ``rows[t]`` rows of ``widths[t]`` bytes at ``offsets[t]`` of the
        source buffer; each gets a log of ``capacity[t]`` rows. The file's pages are mapped populated (the
        caller builds off the request path, so no batch takes their page faults)."""
        plan, cursor = [], 0
        for t in sorted(range(len(offsets)), key=lambda i: offsets[i]):
            first = source.offset + offsets[t]
            file_start = first - first % _PAGE
            file_end = _round_up(first + rows[t] * widths[t], _PAGE)
            start = cursor + first - file_start
            log_start = cursor + file_end - file_start
            first_slot = -(-(log_start - start) // widths[t])
            log_end = _round_up(start + (first_slot + capacity[t]) * widths[t], _PAGE)
            plan.append((t, cursor, file_start, file_end - file_start, log_start, log_end, start, first_slot))
            cursor = log_end
        space = _Range(max(cursor, _PAGE))
        starts, first_slots = [0] * len(offsets), [0] * len(offsets)
        for t, at, file_start, file_bytes, log_start, log_end, start, first_slot in plan:
            space.map(at, file_bytes, _PROT_READ, _MAP_POPULATE, source.fd, file_start)
            space.map(
                log_start, log_end - log_start, _PROT_READ | _PROT_WRITE, _MAP_ANONYMOUS | _MAP_NORESERVE
            )
            starts[t], first_slots[t] = start, first_slot
        return cls(space.tensor(), tuple(starts), tuple(widths), tuple(first_slots), tuple(capacity))

    def slots(self, table: int, first: int, count: int) -> Tensor:
        """Log slots ``[first, first + count)`` of ``table`` as rows ``[count, width]`` (writable)."""
        width = self.widths[table]
        at = self.starts[table] + (self.first_slot[table] + first) * width
        return self.buffer[at : at + count * width].view(count, width)

    def rows(self, table: int, index: Tensor) -> Tensor:
        """Rows ``index`` (base rows or ``first_slot + slot``) of ``table``, copied: ``[n, width]``."""
        width = self.widths[table]
        end = self.starts[table] + (self.first_slot[table] + self.capacity[table]) * width
        return self.buffer[self.starts[table] : end].view(-1, width).index_select(0, index)


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to


def available() -> bool:
    """Whether stitching can be tried here (Linux, libc found)."""
    return _LIBC is not None
