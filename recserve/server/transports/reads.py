"""Reading gRPC request messages under a deadline and a memory bound, in grpcio's thread-per-call server.

grpcio's synchronous server gives a call a pool thread before its request message has arrived, and that
thread waits, with no deadline of its own, until the message is complete or the client goes away. A client
that opens streams and trickles a byte every few seconds would hold every thread. So the server's pools are
:class:`WatchedPool` s: each call a pool thread takes is registered with the :class:`ReadWatch` until its
handler starts (for a request stream: until the first message), which :func:`message_arrived` reports.

- **A read deadline.** A message not complete within ``--grpc-read-timeout`` of the read's start ends the
  call DEADLINE_EXCEEDED, counted. Held streams therefore cost their sender a stream each per deadline, and
  hold a parked thread each meanwhile (:data:`recserve.server.operations.app.READING_THREADS` beyond the
  handlers in the main pool), never an in-flight slot or budget.
- **Fast-read slots.** gRPC core buffers a message whole once its read starts, as fast as the client sends
  it; a read starts only with one of ``fast_reads`` slots (the request budget over twice
  ``--max-message-mb``, at least 8), held until the message is complete or for :data:`FAST_READ_SECONDS`,
  whichever comes first. So at most that many large messages stream into memory at full speed at once; a
  slower sender (a trickling stream, a slow link) holds a thread but no slot.
- **Streaming pools** (``clock_from_submit``): their calls may last for ever, so the pool is small, a call
  queues for a thread, and its read clock runs from the moment it was queued: one whose first message has
  not come within the deadline ends, queued or not.

Handlers, admission and the request memory budget only see calls whose message is complete
(:mod:`recserve.server.transports.status`).

Ending a call before its handler runs uses grpcio's server call object (``cygrpc.Call.cancel``), which its
public API does not expose; :func:`call_of` finds it among the arguments grpcio submits to the pool, and a
grpcio that submits none is reported once and left unwatched (tests/serving/test_held_streams.py fails then).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from concurrent import futures

import grpc

from recserve.errors import InvalidRequestError, RecServeError
from recserve.server.transports.budget import Reservation

logger = logging.getLogger(__name__)

# A read holds its fast-read slot at most this long: a message still arriving then comes from a slow sender.
FAST_READ_SECONDS = 0.02
_TICK_SECONDS = 0.01
MIN_FAST_READS = 8
# A handler behaviour's attribute holding its call's outcome (recserve.server.transports.status.Outcome).
OUTCOME_ATTRIBUTE = "recserve_outcome"


def fast_read_slots(budget_bytes: int, max_message_bytes: int) -> int:
    """Reads that may stream at full speed at once: the budget over twice the largest message, at least 8."""
    return max(MIN_FAST_READS, budget_bytes // (2 * max_message_bytes))


class MessageTooLarge(RecServeError):
    """A request message that inflates past ``--max-message-mb`` (RESOURCE_EXHAUSTED, as gRPC's own limit)."""


class _Read:
    """One call whose request message a pool thread is waiting for."""

    __slots__ = ("call", "outcome", "started", "slot", "state")

    def __init__(self, call, outcome, started: float = 0.0) -> None:
        self.call = call
        self.outcome = outcome
        self.started = started  # 0: still queued for a thread, so nothing is being read yet
        self.slot = False  # holds a fast-read slot
        self.state = "waiting"  # -> "arrived" (the handler runs) or "ended" (the watch ended the call)


_current = threading.local()


def message_arrived() -> bool:
    """Called by a handler as it starts (its request is complete): stops the current call's read clock.

    False when the watch has already ended the call (the handler should then return at once).
    """
    read: _Read | None = getattr(_current, "read", None)
    if read is None:
        return True
    _current.read = None
    watch: ReadWatch = _current.watch
    return watch._arrived(read)


def call_of(args: tuple) -> tuple[object | None, object | None]:
    """grpcio's server call object and the behaviour's outcome among a pool task's arguments."""
    call = outcome = None
    for arg in args:
        if call is None:
            candidate = getattr(arg, "call", None)
            if candidate is not None and hasattr(candidate, "cancel"):
                call = candidate
        if outcome is None:
            outcome = getattr(arg, OUTCOME_ATTRIBUTE, None)
    return call, outcome


class ReadWatch:
    """Ends the calls whose request message is late and lends the fast-read slots (module docstring); one per
    server, with one thread."""

    def __init__(self, *, read_timeout_s: float, fast_reads: int) -> None:
        self.read_timeout_s = read_timeout_s
        self.fast_reads = fast_reads
        self._slots = threading.Semaphore(fast_reads)
        self._reads: set[_Read] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="read-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    # -- the pool side ---------------------------------------------------------------------------------

    def register(self, args: tuple, *, clock_from_submit: bool = False) -> _Read | None:
        call, outcome = call_of(args)
        if call is None:
            if not self._warned:
                self._warned = True
                logger.warning("this grpcio hands its pool no call object: request reads are not watched")
            return None
        read = _Read(call, outcome, time.monotonic() if clock_from_submit else 0.0)
        with self._lock:
            self._reads.add(read)
        return read

    def begin(self, read: _Read, *, fast_read_slot: bool) -> None:
        """The pool thread starts the call: its message is asked of the client now, with a fast-read slot
        when ``fast_read_slot`` (waited for, at most the read timeout)."""
        _current.read, _current.watch = read, self
        if fast_read_slot and not self._slots.acquire(timeout=self.read_timeout_s):
            self.end(
                read,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server busy: {self.fast_reads} request messages arriving at full speed for "
                f"{self.read_timeout_s:g} s (--request-memory-mb); retry with backoff",
            )
            return
        if fast_read_slot:
            with self._lock:
                read.slot = read.state == "waiting"
            if not read.slot:
                self._slots.release()
        if not read.started:
            read.started = time.monotonic()

    def finish(self, read: _Read) -> None:
        """The pool task returned (the call ended, whatever way)."""
        if getattr(_current, "read", None) is read:
            _current.read = None
        with self._lock:
            self._reads.discard(read)
        self._free_slot(read)

    def _free_slot(self, read: _Read) -> None:
        with self._lock:
            had, read.slot = read.slot, False
        if had:
            self._slots.release()

    def _settle(self, read: _Read, state: str) -> bool:
        """Moves ``read`` from waiting to ``state`` ("arrived" or "ended"); False if the other came first."""
        with self._lock:
            if read.state != "waiting":
                return False
            read.state = state
            self._reads.discard(read)
        self._free_slot(read)
        return True

    def _arrived(self, read: _Read) -> bool:
        return self._settle(read, "arrived")

    def end(self, read: _Read, code: grpc.StatusCode, message: str) -> bool:
        """Ends ``read``'s call with ``code`` unless its handler has started; True if it did."""
        if not self._settle(read, "ended"):
            return False
        if read.outcome is not None:
            read.outcome.finish(code)
        try:
            read.call.cancel(code.value[0], message)
        except Exception:  # the call ended meanwhile
            logger.debug("cancelling a late call failed", exc_info=True)
        return True

    # -- the watch's thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(_TICK_SECONDS):
            now = time.monotonic()
            with self._lock:
                reading = [r for r in self._reads if r.started and r.state == "waiting"]
            for read in reading:
                waited = now - read.started
                if waited >= self.read_timeout_s:
                    self.end(
                        read,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"request message: not received within {self.read_timeout_s:g} s "
                        "(--grpc-read-timeout)",
                    )
                elif waited >= FAST_READ_SECONDS and read.slot:
                    self._free_slot(read)  # a slow sender: its slot goes to the next read


class WatchedPool(futures.ThreadPoolExecutor):
    """A gRPC handler pool whose calls are watched until their request message has arrived.

    ``streaming``: the streaming calls' pool: a call's read clock runs from the moment it is queued, and its
    read takes no fast-read slot (its messages are small, and the pool bounds how many run).
    """

    def __init__(
        self, max_workers: int, watch: ReadWatch, *, thread_name_prefix: str, streaming: bool = False
    ) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.watch = watch
        self._streaming = streaming

    def submit(self, fn, /, *args, **kwargs) -> futures.Future:
        read = self.watch.register(args, clock_from_submit=self._streaming)
        return super().submit(self._task, read, fn, args, kwargs)

    def _task(self, read: _Read | None, fn, args, kwargs):
        if read is not None:
            self.watch.begin(read, fast_read_slot=not self._streaming)
        try:
            return fn(*args, **kwargs)
        finally:
            if read is not None:
                self.watch.finish(read)


_INFLATE_STEP = 1 << 20


def inflated_message(raw: bytes, max_bytes: int, held: Reservation | None) -> bytes:
    """``raw`` inflated if the client compressed it (gzip or deflate), in steps reserved from ``held`` and
    counted against ``max_bytes``; otherwise ``raw`` itself.

    The server takes messages as they were sent (``grpc.per_message_decompression`` off), so that a small
    compressed message cannot inflate into memory before the budget is asked; gRPC hands no compression
    flag with the bytes, so the format is told from them: gzip by its magic bytes (no protobuf message starts
    with 0x1f, wire type 7), deflate by zlib's header, kept as it came when it does not inflate (a protobuf
    message may start with those bytes too).
    """
    if raw[:2] == b"\x1f\x8b":
        wbits, strict, name = 16 + zlib.MAX_WBITS, True, "gzip"
    elif raw[:1] == b"\x78" and int.from_bytes(raw[:2], "big") % 31 == 0:
        wbits, strict, name = zlib.MAX_WBITS, False, "deflate"
    else:
        return raw
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size, pending = 0, raw
    try:
        while pending and not inflater.eof:
            out = inflater.decompress(pending, min(_INFLATE_STEP, max_bytes - size + 1))
            pending = inflater.unconsumed_tail
            size += len(out)
            if size > max_bytes:
                raise MessageTooLarge(
                    f"request message: {name}-compressed, inflates past {max_bytes} bytes (--max-message-mb)"
                )
            if held is not None:
                held.grow(2 * len(out))  # the parts, then the joined message
            parts.append(out)
    except zlib.error as exc:
        if not strict:
            return raw
        raise InvalidRequestError(f"request message: gzip-compressed but does not inflate ({exc})") from None
    if not inflater.eof:
        if not strict:
            return raw
        raise InvalidRequestError("request message: gzip-compressed but ends before its stream does")
    return b"".join(parts)
