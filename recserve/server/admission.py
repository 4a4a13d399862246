"""Admission control: a bounded count of RPCs in flight per worker process, decided when an RPC arrives.

gRPC Python hands every RPC to its handler thread pool, whose queue is unbounded: without a limit in front of
it, a burst waits there (invisible to the batcher, whose queue never fills) until clients give up. The
interceptor (:mod:`recserve.server.status`) asks :class:`AdmissionLimit` on gRPC's polling thread, at arrival;
an RPC over the limit is answered RESOURCE_EXHAUSTED by a small pool of its own (``shed_pool``), so refusals
never wait behind admitted work. The limit is at most the handler threads, so that every admitted RPC has a
thread at once and the queue that builds up under load is the batcher's, where deadlines are enforced.
"""

from __future__ import annotations

import threading
from concurrent import futures

# Handler threads kept free of admitted work, for health probes (exempt from the limit) and metadata calls.
_MIN_SPARE_THREADS = 1


def default_max_inflight(grpc_threads: int, max_queue_size: int) -> int:
    """``--max-inflight`` when not given: the handler threads less one in eight, at most the batcher's queue.

    Every admitted RPC then gets a handler thread at once (the spare threads answer health probes under load),
    and the batcher can queue all of them, so its queue bound is never the one that trips first.
    """
    spare = max(_MIN_SPARE_THREADS, grpc_threads // 8)
    return max(1, min(grpc_threads - spare, max_queue_size))


class AdmissionLimit:
    """At most ``limit`` RPCs admitted at once; :meth:`try_acquire` never blocks."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_inflight must be >= 1, got {limit}")
        self.limit = limit
        self._count = 0
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        """Takes a slot and returns True, or returns False at once when ``limit`` are taken."""
        with self._lock:
            if self._count >= self.limit:
                return False
            self._count += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._count -= 1

    @property
    def in_flight(self) -> int:
        return self._count


def shed_pool() -> futures.ThreadPoolExecutor:
    """The threads that answer refused RPCs: two are plenty, a refusal takes microseconds."""
    return futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpc-shed")
