"""``Prefetcher``: an iterator read ahead by a background thread, so batches are ready when training asks.

Batch building here is NumPy and torch copies, which release the GIL, so one thread overlaps it with the
training step without the cost of worker processes (pickling every batch through shared memory), which on a
small machine compete with training for the same cores. An exception in the thread (a malformed row with
``strict``) is raised to the consumer at the point its batch would have come.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_ITEM, _END, _ERROR = 0, 1, 2
_POLL_S = 0.1


class Prefetcher(Iterator[T], Generic[T]):
    """The items of ``source`` in order, produced up to ``depth`` ahead in a daemon thread."""

    def __init__(self, source: Iterable[T], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"Prefetcher depth must be >= 1, got {depth}")
        self._queue: queue.Queue[tuple[int, object]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # The thread holds the queue and the event, not ``self``: a dropped Prefetcher is collected, and
        # ``__del__`` stops the thread.
        self._thread = threading.Thread(
            target=_produce, args=(source, self._queue, self._stop), daemon=True, name="rectrain-prefetch"
        )
        self._thread.start()

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value  # type: ignore[return-value]
        self._done = True
        self._stop.set()
        if kind == _ERROR:
            assert isinstance(value, BaseException)
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the thread (it finishes the item it is building); further ``next`` calls end."""
        self._done = True
        self._stop.set()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # absent when __init__ refused its arguments
        if stop is not None:
            stop.set()


def _put(q: queue.Queue, stop: threading.Event, message: tuple[int, object]) -> bool:
    while not stop.is_set():
        try:
            q.put(message, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _produce(source: Iterable[object], q: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in source:
            if not _put(q, stop, (_ITEM, item)):
                return
        _put(q, stop, (_END, None))
    except BaseException as e:  # handed to the consumer, which raises it
        _put(q, stop, (_ERROR, e))
