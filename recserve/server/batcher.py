"""Dynamic batching: one small object that merges concurrent requests into batches for one callable.

Knobs are named as Triton names them. A batch closes when it holds ``max_batch_size`` examples, or when its
oldest request has waited ``max_queue_delay_s`` since it *arrived* (not since the worker looked), whichever
comes first. The queue is bounded: a request that finds ``max_queue_size`` requests waiting is refused at once
with :class:`OverloadedError`. Requests whose deadline passed while queued are failed with
:class:`DeadlineExceededError` and left out of the batch before it is computed. Every request gets its own
future; when the batch function raises, every request of that batch gets the exception.
"""

from __future__ import annotations

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

    A single daemon thread forms and runs the batches, so ``fn`` is never called concurrently with itself.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        config: BatcherConfig,
        *,
        observer: BatchObserver | None = None,
        name: str = "batcher",
    ) -> None:
        self._fn = fn
        self.config = config
        self._observer = observer
        self._queue: collections.deque[_Pending[T]] = collections.deque()
        self._queued_examples = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T, *, size: int, deadline: float | None = None) -> Future:
        """Queues ``item`` (``size`` examples); ``deadline`` is a ``time.monotonic()`` instant or None.

        Returns a future of :class:`Completed`. Raises :class:`OverloadedError` when the queue is full and
        :class:`UnavailableError` once the batcher is closed.
        """
        pending = _Pending(item, size, time.monotonic(), deadline)
        with self._cond:
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
            # Wake the batch thread only when it has something new to decide on.
            if was_empty or self._queued_examples >= self.config.max_batch_size:
                self._cond.notify()
        if self._observer is not None:
            self._observer.queue_depth(depth)
        return pending.future

    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, timeout: float | None = None) -> None:
        """Refuses new requests, finishes every queued one, and stops the batch thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._execute(batch)

    def _next_batch(self) -> list[_Pending[T]] | None:
        cfg = self.config
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            while not self._closed and self._queued_examples < cfg.max_batch_size:
                remaining = self._queue[0].arrival + cfg.max_queue_delay_s - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = [self._queue.popleft()]
            examples = batch[0].size
            while self._queue and examples + self._queue[0].size <= cfg.max_batch_size:
                examples += self._queue[0].size
                batch.append(self._queue.popleft())
            self._queued_examples -= examples
            depth = len(self._queue)
        if self._observer is not None:
            self._observer.queue_depth(depth)
        return batch

    def _execute(self, batch: list[_Pending[T]]) -> None:
        start = time.monotonic()
        live = []
        for p in batch:
            if p.deadline is not None and p.deadline <= start:
                waited = start - p.arrival
                p.future.set_exception(
                    DeadlineExceededError(f"deadline passed after {waited * 1e3:.1f} ms in the queue")
                )
            elif p.future.set_running_or_notify_cancel():
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
            p.future.set_result(Completed(result, wait, seconds, examples))
        if self._observer is not None:
            self._observer.batch_done(examples, waits, seconds)
