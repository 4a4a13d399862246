"""A byte budget per worker for what requests hold in memory, reserved before it is read or inflated.

Connection and in-flight counts do not bound memory: one connection may hold a 64 MiB body, or a 61 KB gzip
body that inflates to 60 MB. So the REST server reserves from a :class:`MemoryBudget` before it reads,
inflates or decodes (growing the reservation as a streamed body arrives), and refuses the request when the
budget is spent (HTTP 503, or 413 for one body over the size limit) instead of allocating. A reservation is
returned when its request is answered. Thread-safe, so that any transport of the worker can share it.

The default (:func:`default_request_budget`) is a quarter of the worker's share of the memory the server may
use (the cgroup limit, else ``MemAvailable``), at most 512 MiB and at least enough for two requests of the
largest message size.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

from recserve.errors import OverloadedError

GIB = 1 << 30
# The default's cap: with what a worker holds beyond its budget (allocator slack, the request being parsed)
# a worker stays well under 1 GiB for requests.
MAX_DEFAULT_BUDGET = GIB // 2
# What one request's message costs beyond its bytes on the wire: the bytes, the parsed message and the
# decoded tensors exist at once while it is turned into a batch item.
DECODE_FACTOR = 3
# Reservations from this size up count towards the next heap trim (HeapTrimmer).
LARGE_REQUEST_BYTES = 1 << 20


class BudgetExhausted(OverloadedError):
    """A reservation did not fit in the budget (RESOURCE_EXHAUSTED; REST answers 503 with Retry-After)."""


class MemoryBudget:
    """At most ``limit`` bytes reserved at once; reservations never block."""

    def __init__(self, limit: int, *, trim_heap: bool = True) -> None:
        if limit < 1:
            raise ValueError(f"request memory budget must be >= 1 byte, got {limit}")
        self.limit = limit
        self._used = 0
        self._peak = 0
        self._lock = threading.Lock()
        self._trimmer = HeapTrimmer() if trim_heap else None

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        """The most bytes ever reserved at once."""
        return self._peak

    def reserve(self, nbytes: int = 0) -> Reservation:
        """A reservation of ``nbytes`` (:class:`BudgetExhausted` if they do not fit); grow it later."""
        reservation = Reservation(self)
        reservation.grow(nbytes)
        return reservation

    def _take(self, nbytes: int) -> bool:
        with self._lock:
            if self._used + nbytes > self.limit:
                return False
            self._used += nbytes
            self._peak = max(self._peak, self._used)
            return True

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes
        if self._trimmer is not None:
            self._trimmer.freed(nbytes)


class Reservation:
    """Bytes one request holds; :meth:`release` (or leaving the ``with`` block) returns them all."""

    __slots__ = ("_budget", "nbytes")

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self.nbytes = 0

    def grow(self, nbytes: int) -> None:
        """Holds ``nbytes`` more, or raises :class:`BudgetExhausted` (holding what it held before)."""
        if nbytes <= 0:
            return
        if not self._budget._take(nbytes):
            b = self._budget
            raise BudgetExhausted(
                f"server overloaded: requests in this worker hold {b.used / 2**20:.0f} MiB of its "
                f"{b.limit / 2**20:.0f} MiB request memory (--request-memory-mb); this one needs "
                f"{(self.nbytes + nbytes) / 2**20:.1f} MiB; retry with backoff"
            )
        self.nbytes += nbytes

    def resize(self, nbytes: int) -> None:
        """Holds exactly ``nbytes``: shrinking always succeeds, growing may raise :class:`BudgetExhausted`."""
        if nbytes >= self.nbytes:
            self.grow(nbytes - self.nbytes)
        else:
            self._budget._give(self.nbytes - nbytes)
            self.nbytes = nbytes

    def release(self) -> None:
        if self.nbytes:
            self._budget._give(self.nbytes)
            self.nbytes = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def memory_limit_bytes() -> int | None:
    """The memory this process may use: its cgroup's limit (v2 or v1) if set, else ``MemAvailable``."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 reports "no limit" as a huge number
            return int(text)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_request_budget(workers: int, max_message_bytes: int, available: int | None = None) -> int:
    """``--request-memory-mb`` when not given: a quarter of the worker's memory share, at most 512 MiB, at
    least two largest requests (so a valid request always fits an idle worker)."""
    available = memory_limit_bytes() if available is None else available
    floor = 2 * DECODE_FACTOR * max_message_bytes
    if available is None:
        return max(floor, MAX_DEFAULT_BUDGET // 2)
    return max(floor, min(MAX_DEFAULT_BUDGET, available // (4 * max(1, workers))))


class HeapTrimmer:
    """Gives freed heap back to the system after large requests (glibc keeps it mapped otherwise).

    A burst of large requests leaves glibc's arenas holding their peak; ``malloc_trim`` returns the free
    pages, so the worker's resident memory follows the budget down as well as up. Called as reservations are
    released; a trim runs once ``min_bytes`` of large reservations have been freed since the last.
    """

    def __init__(self, min_bytes: int = 64 << 20) -> None:
        self._min_bytes = min_bytes
        self._freed = 0
        self._lock = threading.Lock()
        self._trim = _malloc_trim()

    def freed(self, nbytes: int) -> None:
        # Small requests reuse the heap they freed; a trim after them only costs page faults later.
        if self._trim is None or nbytes < LARGE_REQUEST_BYTES:
            return
        with self._lock:
            self._freed += nbytes
            if self._freed < self._min_bytes:
                return
            self._freed = 0
        self._trim(0)


class ProcessMemory:
    """This process's anonymous resident memory (heap, thread stacks, buffers) above a baseline.

    What gRPC core holds for messages still arriving is invisible to Python call by call, but it is heap, so
    it shows here; the read watch (:mod:`recserve.server.transports.reads`) reads :meth:`growth` every tick.
    The baseline is the memory held when no request holds any: taken at :meth:`rebase` (after giving freed
    heap back to the system, so that memory freed but kept by the allocator is not counted as a baseline
    that new requests could fill unseen), and lowered whenever the process holds less.
    """

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._trim = _malloc_trim()
        self.baseline = self.anon_bytes()

    def anon_bytes(self) -> int:
        """Resident anonymous bytes: statm's resident pages less its file-backed and shared ones."""
        try:
            with open("/proc/self/statm", "rb") as f:
                fields = f.read().split()
            return (int(fields[1]) - int(fields[2])) * self._page
        except (OSError, IndexError, ValueError):
            return 0

    def growth(self) -> int:
        """Bytes above the baseline now (never negative: a lower reading becomes the baseline)."""
        now = self.anon_bytes()
        if now < self.baseline:
            self.baseline = now
        return now - self.baseline

    def trim(self) -> None:
        if self._trim is not None:
            self._trim(0)

    def rebase(self) -> None:
        """The baseline is the memory held now, with freed heap given back first."""
        self.trim()
        self.baseline = self.anon_bytes()


def _malloc_trim():
    if os.name != "posix":
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
