"""Dynamic batching: one small object that merges concurrent requests into batches for one callable.

Knobs are named as Triton names them. A batch closes when it holds ``max_batch_size`` examples, or when its
oldest request has waited ``max_queue_delay_s`` since it *arrived* (not since the worker looked), whichever
comes first. The queue is bounded: a request that finds ``max_queue_size`` requests waiting is refused at once
with :class:`OverloadedError`. Requests whose deadline passed while queued are failed with
:class:`DeadlineExceededError` and left out of the batch before it is computed. Every request gets its own
future; when the batch function raises, every request of that batch gets the exception.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from recserve.errors import DeadlineExceededError, OverloadedError, UnavailableError

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class BatcherConfig:
    """Batching limits; sizes in examples (``max_batch_size``) and requests (``max_queue_size``)."""

    max_batch_size: int = 512
    max_queue_delay_s: float = 0.002
    max_queue_size: int = 4096

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")


@dataclass(frozen=True)
class Completed(Generic[R]):
    """A request's result and where its time went (seconds)."""

    result: R
    queue_seconds: float
    inference_seconds: float
    batch_size: int  # examples in the batch the request was computed in


class BatchObserver(Protocol):
    """Receives the batcher's measurements (the server's metrics implement it)."""

    def queue_depth(self, requests: int) -> None: ...

    def batch_done(self, examples: int, queue_waits: Sequence[float], seconds: float) -> None: ...


@dataclass(eq=False)
class _Pending(Generic[T]):
    item: T
    size: int
    arrival: float
    deadline: float | None
    future: Future = field(default_factory=Future)


class DynamicBatcher(Generic[T, R]):
    """Runs ``fn(items) -> results`` (one result per item, in order) on batches formed from ``submit`` calls.

    Batches form and run on one asyncio event loop, so ``fn`` is never called concurrently with itself:
    ``loop`` when given (a server whose event loop also answers the RPCs runs its batches between them, with
    no second busy thread), else a loop of the batcher's own on a daemon thread. ``submit`` may be called
    from any thread.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        config: BatcherConfig,
        *,
        observer: BatchObserver | None = None,
        name: str = "batcher",
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._fn = fn
        self.config = config
        self._observer = observer
        self._queue: collections.deque[_Pending[T]] = collections.deque()
        self._queued_examples = 0
        self._lock = threading.Lock()
        self._closed = False
        self._drained = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._wake_pending = False  # a _decide is scheduled: a submit need not schedule another
        self._thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
            self._thread.start()
        self._loop = loop

    def submit(self, item: T, *, size: int, deadline: float | None = None) -> Future:
        """Queues ``item`` (``size`` examples); ``deadline`` is a ``time.monotonic()`` instant or None.

        Returns a future of :class:`Completed`. Raises :class:`OverloadedError` when the queue is full and
        :class:`UnavailableError` once the batcher is closed.
        """
        pending = _Pending(item, size, time.monotonic(), deadline)
        with self._lock:
            if self._closed:
                raise UnavailableError("the server is shutting down and accepts no new requests")
            if len(self._queue) >= self.config.max_queue_size:
                raise OverloadedError(
                    f"request queue full: {len(self._queue)} requests waiting "
                    f"(max_queue_size={self.config.max_queue_size}); retry with backoff"
                )
            was_empty = not self._queue
            self._queue.append(pending)
            self._queued_examples += size
            depth = len(self._queue)
            # Wake the loop only when it has something new to decide on.
            wake = was_empty or self._queued_examples >= self.config.max_batch_size
        if wake:
            self._wake()
        if self._observer is not None:
            self._observer.queue_depth(depth)
        return pending.future

    def queue_depth(self) -> int:
        with self._lock:
            return len(self._queue)

    def queued_examples(self) -> int:
        """Examples waiting in the queue (not those of the batch being computed)."""
        with self._lock:
            return self._queued_examples

    def close(self, timeout: float | None = None) -> None:
        """Refuses new requests, finishes every queued one, and stops the batcher's own loop (if it has one).

        Called on the batcher's loop itself, it runs the queued batches there and then returns.
        """
        with self._lock:
            self._closed = True
        if self._on_loop():
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self._run_batch():
                pass
            self._drained.set()
            return
        self._wake()
        # Past the timeout the batcher's own loop keeps draining in the background rather than drop requests.
        if self._drained.wait(timeout) and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _wake(self) -> None:
        """Schedules one :meth:`_decide` on the loop, unless one is already scheduled."""
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        if self._on_loop():
            self._loop.call_soon(self._decide)
        else:
            self._loop.call_soon_threadsafe(self._decide)

    def _decide(self) -> None:
        """On the loop: run a batch now if one is due, else set a timer for when the oldest request's wait
        ends (a batch closes at ``max_batch_size`` examples or ``max_queue_delay_s`` after its oldest
        request arrived)."""
        cfg = self.config
        with self._lock:
            self._wake_pending = False
            if not self._queue:
                if self._closed:
                    self._drained.set()
                return
            due = self._queue[0].arrival + cfg.max_queue_delay_s
            ready = self._closed or self._queued_examples >= cfg.max_batch_size
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        remaining = due - time.monotonic()
        if ready or remaining <= 0:
            try:
                self._run_batch()
            finally:
                self._wake()  # the rest of the queue, after the loop has taken what arrived meanwhile
        else:
            self._timer = self._loop.call_at(self._loop.time() + remaining, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._decide()

    def _run_batch(self) -> bool:
        """Takes the next batch off the queue and computes it; False if the queue was empty."""
        cfg = self.config
        with self._lock:
            if not self._queue:
                return False
            batch = [self._queue.popleft()]
            examples = batch[0].size
            while self._queue and examples + self._queue[0].size <= cfg.max_batch_size:
                examples += self._queue[0].size
                batch.append(self._queue.popleft())
            self._queued_examples -= examples
            depth = len(self._queue)
        if self._observer is not None:
            self._observer.queue_depth(depth)
        self._execute(batch)
        return True

    def _execute(self, batch: list[_Pending[T]]) -> None:
        start = time.monotonic()
        live = []
        for p in batch:
            if not p.future.set_running_or_notify_cancel():
                continue  # its caller cancelled it (a client that left): nothing to answer
            if p.deadline is not None and p.deadline <= start:
                waited = start - p.arrival
                p.future.set_exception(
                    DeadlineExceededError(f"deadline passed after {waited * 1e3:.1f} ms in the queue")
                )
            else:
                live.append(p)
        if not live:
            return
        try:
            results = self._fn([p.item for p in live])
            if len(results) != len(live):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(live)} items")
        except Exception as exc:  # delivered to every caller of the batch
            logger.exception("batch of %d requests failed", len(live))
            for p in live:
                p.future.set_exception(exc)
            return
        seconds = time.monotonic() - start
        examples = sum(p.size for p in live)
        waits = [start - p.arrival for p in live]
        for p, result, wait in zip(live, results, waits):
            if isinstance(result, Exception):  # the batch ran, but this item's result is refused
                p.future.set_exception(result)
            else:
                p.future.set_result(Completed(result, wait, seconds, examples))
        if self._observer is not None:
            self._observer.batch_done(examples, waits, seconds)
