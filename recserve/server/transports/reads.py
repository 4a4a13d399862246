"""Reading gRPC request messages under a deadline and a memory bound, in grpcio's thread-per-call server.

grpcio's synchronous server gives a call a pool thread before its request message has arrived, and that
thread waits, with no deadline of its own, until the message is complete or the client goes away. A client
that opens streams and trickles a byte every few seconds would hold every thread. So the server's pools are
:class:`WatchedPool` s: each call a pool thread takes is registered with the :class:`ReadWatch` until its
handler starts (for a request stream: until the first message), which :func:`message_arrived` reports.

- **A read deadline.** A message not complete within ``--grpc-read-timeout`` of the read's start ends the
  call DEADLINE_EXCEEDED, counted: each read at its own moment between that timeout and
  :data:`READ_DEADLINE_SPREAD` more, drawn at random as it starts, so that streams opened together (a client's
  burst, or the streams it opens again as the server ends them) are not all ended, and opened again, in the
  same tick: ending and opening a call takes several hand-offs between gRPC's polling thread and the pool
  threads, and a few hundred at once delay every new call behind them (the queue lag then sheds normal
  calls). Held streams therefore cost their sender a stream each per deadline, and
  hold a parked thread each meanwhile (:data:`recserve.server.operations.app.READING_THREADS` beyond the
  handlers in the main pool), never an in-flight slot or budget.
- **Fast-read slots.** gRPC core buffers a message whole once its read starts, as fast as the client sends
  it; a read starts only with one of ``fast_reads`` slots (the request budget over twice
  ``--max-message-mb``, at least 8), held until the message is complete or for :data:`FAST_READ_SECONDS`,
  whichever comes first. So at most that many large messages stream into memory at full speed at once; a
  slower sender (a trickling stream, a slow link) holds a thread but no slot.
- **Read memory.** A slot only bounds fast senders; a message arriving more slowly still grows in gRPC core
  unseen. So the watch samples the worker's anonymous resident memory every tick
  (:class:`~recserve.server.transports.budget.ProcessMemory`): a read starts only while that growth plus a
  whole message for each read holding a slot is under :func:`read_memory_limit`, and past the limit the
  oldest reads still arriving are ended RESOURCE_EXHAUSTED, enough to free the excess. A held stream holds a
  few bytes: it costs nothing here until memory is short.
- **Only while reads are held.** The watch ticks every 10 ms while calls are registered and sleeps when
  none is (a worker at rest spends no CPU on it); the first call after a quiet spell wakes it.
- **Streaming pools** (``clock_from_submit``): their calls may last for ever, so the pool is small, a call
  queues for a thread, and its read clock runs from the moment it was queued: one whose first message has
  not come within the deadline ends, queued or not. At most ``max_calls`` run or queue at once; one more is
  ended RESOURCE_EXHAUSTED as it arrives, so that streaming calls never fill gRPC's count of RPCs in flight
  (``maximum_concurrent_rpcs``), which unary calls and health checks share.

Handlers, admission and the request memory budget only see calls whose message is complete
(:mod:`recserve.server.transports.status`).

Ending a call before its handler runs uses grpcio's server call object (``cygrpc.Call.cancel``), which its
public API does not expose; :func:`call_of` finds it among the arguments grpcio submits to the pool, and a
grpcio that submits none is reported once and left unwatched (tests/serving/test_held_streams.py fails then).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from concurrent import futures

import grpc

from recserve.errors import InvalidRequestError, RecServeError
from recserve.server.transports.budget import MemoryBudget, ProcessMemory, Reservation

logger = logging.getLogger(__name__)

# A read holds its fast-read slot at most this long: a message still arriving then comes from a slow sender.
FAST_READ_SECONDS = 0.02
_TICK_SECONDS = 0.01
# A read ends at a moment drawn between its read timeout and this fraction more (module docstring).
READ_DEADLINE_SPREAD = 0.25
MIN_FAST_READS = 8
# Room above the request budget for what a worker's memory does beside requests (threads starting, allocator
# slack), so that the read watch does not take that for messages arriving.
READ_MEMORY_SLACK = 64 << 20
# What a worker's memory may grow by beyond its request memory, the slack and one message (the documented
# bound): bytes gRPC core takes in during a tick of the watch before it ends reads, messages being copied into
# Python as they arrive, the allocator's own.
GROWTH_CONSTANT = 128 << 20
# The baseline is taken again after this long with nothing held for requests and memory above it.
QUIET_SECONDS = 0.2
TRIM_INTERVAL_S = 0.1
# A handler behaviour's attribute holding its call's outcome (recserve.server.transports.status.Outcome).
OUTCOME_ATTRIBUTE = "recserve_outcome"
# A handler behaviour's attribute holding a refusal's message: a pool ends such a call RESOURCE_EXHAUSTED
# as it is submitted, on gRPC's polling thread, without a pool thread or reading its message.
REFUSAL_ATTRIBUTE = "recserve_refusal"


def fast_read_slots(budget_bytes: int, max_message_bytes: int) -> int:
    """Reads that may stream at full speed at once: the budget over twice the largest message, at least 8."""
    return max(MIN_FAST_READS, budget_bytes // (2 * max_message_bytes))


def read_memory_limit(budget_bytes: int) -> int:
    """The worker's memory growth past which messages still arriving are ended and no read starts."""
    return budget_bytes + READ_MEMORY_SLACK


class MessageTooLarge(RecServeError):
    """A request message that inflates past ``--max-message-mb`` (RESOURCE_EXHAUSTED, as gRPC's own limit)."""


class _Read:
    """One call whose request message a pool thread is waiting for."""

    __slots__ = ("call", "outcome", "started", "deadline", "slot", "state", "running", "bounded")

    def __init__(self, call, outcome, bounded: bool = True) -> None:
        self.call = call
        self.outcome = outcome
        self.started = 0.0  # 0: still queued for a thread, so nothing is being read yet
        self.deadline = 0.0  # when the watch ends the call if its message has not arrived (start())
        self.slot = False  # holds a fast-read slot
        self.running = False  # a pool thread has asked for its message
        self.bounded = bounded  # ended when the memory of messages arriving passes the limit
        self.state = "waiting"  # -> "arrived" (the handler runs) or "ended" (the watch ended the call)

    def start(self, now: float, timeout_s: float) -> None:
        """The read clock starts: the call ends at a moment spread over ``timeout_s`` to
        ``timeout_s * (1 + READ_DEADLINE_SPREAD)`` from ``now`` unless its message arrives first."""
        self.deadline = now + timeout_s * (1.0 + READ_DEADLINE_SPREAD * random.random())
        self.started = now


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


def refusal_of(args: tuple) -> str | None:
    """The message of a behaviour marked as a refusal (:data:`REFUSAL_ATTRIBUTE`) among a pool task's
    arguments, or None."""
    for arg in args:
        message = getattr(arg, REFUSAL_ATTRIBUTE, None)
        if message is not None:
            return message
    return None


class ReadWatch:
    """Ends the calls whose request message is late, lends the fast-read slots and holds the memory of
    messages being read under a limit (module docstring); one per server, with one thread.

    ``memory`` None: no memory limit (only the slots bound the reads).
    """

    def __init__(
        self,
        *,
        read_timeout_s: float,
        fast_reads: int,
        memory: ProcessMemory | None = None,
        memory_limit: int = 0,
        max_message_bytes: int = 64 << 20,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.read_timeout_s = read_timeout_s
        self.fast_reads = fast_reads
        self.memory = memory
        self.memory_limit = memory_limit
        self.max_message_bytes = max_message_bytes
        self._budget = budget
        self._fast = 0  # reads holding a fast-read slot
        self._growth = 0  # the process's memory growth at the last tick (ProcessMemory.growth)
        self._gate = threading.Condition(threading.Lock())
        self._reads: set[_Read] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set when a read registers: the watch sleeps while none is held
        self._thread: threading.Thread | None = None
        self._warned = False
        self._quiet_since: float | None = None
        self._last_trim = 0.0
        self.memory_cancels = 0  # reads ended because the memory of messages arriving passed the limit
        self.ticks = 0  # the watch's ticks so far (none while the worker is at rest)

    def start(self) -> None:
        if self.memory is not None:
            self.memory.rebase()
        self._thread = threading.Thread(target=self._run, name="read-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    # -- the pool side ---------------------------------------------------------------------------------

    def register(self, args: tuple, *, clock_from_submit: bool = False, bounded: bool = True) -> _Read | None:
        call, outcome = call_of(args)
        if call is None:
            if not self._warned:
                self._warned = True
                logger.warning("this grpcio hands its pool no call object: request reads are not watched")
            return None
        read = _Read(call, outcome, bounded)
        if clock_from_submit:
            read.start(time.monotonic(), self.read_timeout_s)
        with self._lock:
            self._reads.add(read)
        if not self._wake.is_set():
            self._wake.set()
        return read

    def _may_start(self) -> bool:
        # Each read holding a slot may still bring a whole message: counted as one, over what is held now.
        if self._fast >= self.fast_reads:
            return False
        if self.memory is None:
            return True
        return self._growth + self._fast * self.max_message_bytes < self.memory_limit

    def begin(self, read: _Read, *, fast_read_slot: bool) -> None:
        """The pool thread starts the call: its message is asked of the client now, with a fast-read slot
        when ``fast_read_slot`` (waited for, at most the read timeout)."""
        _current.read, _current.watch = read, self
        if fast_read_slot:
            with self._gate:
                admitted = self._gate.wait_for(self._may_start, timeout=self.read_timeout_s)
                if admitted:
                    self._fast += 1
            if not admitted:
                self.end(
                    read,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"server busy: request messages arriving at full speed or holding the worker's request "
                    f"memory for {self.read_timeout_s:g} s (--request-memory-mb); retry with backoff",
                )
                return
            with self._lock:
                read.slot = read.state == "waiting"
            if not read.slot:
                self._release_slot()
        read.running = True
        if not read.started:
            read.start(time.monotonic(), self.read_timeout_s)

    def finish(self, read: _Read) -> None:
        """The pool task returned (the call ended, whatever way)."""
        if getattr(_current, "read", None) is read:
            _current.read = None
        with self._lock:
            self._reads.discard(read)
        self._free_slot(read)

    def _release_slot(self) -> None:
        with self._gate:
            self._fast -= 1
            self._gate.notify()

    def _free_slot(self, read: _Read) -> None:
        with self._lock:
            had, read.slot = read.slot, False
        if had:
            self._release_slot()

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

    def _at_rest(self) -> bool:
        """No read registered and nothing left to settle (a baseline to re-take): the watch may sleep."""
        if self._reads:
            return False
        return self.memory is None or (self._quiet_since is None and self._growth < self.memory_limit // 8)

    def _run(self) -> None:
        # Ticks only while reads are registered (and until the baseline settles after them): a worker at rest
        # spends no CPU here, and the first call after a quiet spell wakes the watch.
        while not self._stop.is_set():
            if self._at_rest():
                self._wake.clear()
                if self._at_rest():  # a read that registered between the test and the clear set it again
                    self._wake.wait()
                if self._stop.is_set():
                    return
                self._woken()
            else:
                self._stop.wait(_TICK_SECONDS)
            self._tick()

    def _woken(self) -> None:
        """After a quiet spell: memory that grew meanwhile with nothing held for requests (a reload's larger
        model, heap kept by the allocator) is the new baseline, as the ticks would have made it."""
        memory = self.memory
        if memory is None or (self._budget is not None and self._budget.used > 0):
            return
        if memory.growth() >= self.memory_limit // 8:
            memory.rebase()

    def _tick(self) -> None:
        self.ticks += 1
        now = time.monotonic()
        with self._lock:
            reading = [r for r in self._reads if r.started and r.state == "waiting"]
        excess = 0 if self.memory is None else self._watch_memory(now, bool(reading))
        for read in reading:
            if now >= read.deadline:
                self.end(
                    read,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"request message: not received within {self.read_timeout_s:g} s (--grpc-read-timeout)",
                )
            elif now - read.started >= FAST_READ_SECONDS and read.slot:
                self._free_slot(read)  # a slow sender: its slot goes to the next read
        if excess > 0:
            self._end_for_memory(now, reading, excess)

    def _end_for_memory(self, now: float, reading: list[_Read], excess: int) -> None:
        """Ends the oldest reads still arriving, enough of them to free ``excess`` bytes if each held a whole
        message: the oldest hold the most (a large message arriving slowly) or are held streams; a small
        message whose arrival is merely late (a busy worker) is among the youngest."""
        slow = [
            r
            for r in reading
            if r.bounded and r.running and not r.slot and now - r.started >= FAST_READ_SECONDS
        ]
        slow.sort(key=lambda r: r.started)
        count = -(-excess // self.max_message_bytes)
        for read in slow[:count]:
            if self.end(
                read,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server busy: request messages still arriving hold the worker's request memory "
                f"({self.memory_limit / 2**20:.0f} MiB, --request-memory-mb); retry with backoff",
            ):
                self.memory_cancels += 1
        self._trim(now)

    def _watch_memory(self, now: float, reading: bool) -> bool:
        """Samples the process's memory growth, lets waiting reads start when it allows, re-takes the
        baseline once nothing is held for requests; the bytes of growth over the limit (0 if none)."""
        memory = self.memory
        assert memory is not None
        growth = memory.growth()
        held = reading or (self._budget is not None and self._budget.used > 0)
        if held or growth < self.memory_limit // 8:
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = now
        elif now - self._quiet_since >= QUIET_SECONDS:
            # Nothing held for requests, yet the process holds more than at the baseline: memory kept by the
            # allocator, or the model's own (a reload): the baseline moves up to it.
            memory.rebase()
            growth = memory.growth()
            self._quiet_since = None
        with self._gate:
            fell, self._growth = growth < self._growth, growth
            if fell:  # reads waiting for memory may start now
                self._gate.notify_all()
        return max(0, growth - self.memory_limit)

    def _trim(self, now: float) -> None:
        # Ended reads free their bytes in gRPC core; the allocator keeps them mapped until trimmed.
        if now - self._last_trim >= TRIM_INTERVAL_S:
            self._last_trim = now
            self.memory.trim()


class WatchedPool(futures.ThreadPoolExecutor):
    """A gRPC handler pool whose calls are watched until their request message has arrived.

    ``streaming``: the streaming calls' pool: a call's read clock runs from the moment it is queued, and its
    read takes no fast-read slot (its messages are small, and the pool bounds how many run). ``gated`` False:
    the server's own small pools (refusals, queue-lag probes): reads take no slot and are never ended for
    memory, so that a flood of large messages does not read as queue lag; the pool's size bounds them.
    """

    def __init__(
        self,
        max_workers: int,
        watch: ReadWatch,
        *,
        thread_name_prefix: str,
        streaming: bool = False,
        gated: bool = True,
        max_calls: int | None = None,
    ) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.watch = watch
        self._streaming = streaming
        self._gated = gated and not streaming
        self.max_calls = max_calls
        self._calls = 0  # calls running or queued here
        self._calls_lock = threading.Lock()
        self.refused = 0  # calls ended as they were submitted (refusals, streaming calls past max_calls)

    def submit(self, fn, /, *args, **kwargs) -> futures.Future:
        read = self.watch.register(
            args, clock_from_submit=self._streaming, bounded=self._gated or self._streaming
        )
        if read is not None:
            refusal = refusal_of(args)
            if refusal is not None:
                return self._refuse(read, refusal)
        if self.max_calls is not None and read is not None:
            with self._calls_lock:
                full = self._calls >= self.max_calls
                if not full:
                    self._calls += 1
            if full:
                # Calls that may last for ever (held streams) never pile up in gRPC's count of RPCs in
                # flight, where they would crowd out unary calls and health checks.
                return self._refuse(
                    read,
                    f"server busy: {self.max_calls} streaming calls (health Watch, reflection) already open "
                    "or waiting in this worker (4 x --max-streaming-calls); retry with backoff",
                )
        return super().submit(self._task, read, fn, args, kwargs)

    def _refuse(self, read: _Read, message: str) -> futures.Future:
        # Ended before it queues, here on gRPC's polling thread: no pool thread wakes for it and its message
        # is never read, so a refusal costs the least there is (a held stream refused this way is opened
        # again by its sender at once, however long its refusal takes).
        self.refused += 1
        self.watch.end(read, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.watch.finish(read)
        done: futures.Future = futures.Future()
        done.set_result(None)
        return done

    def _task(self, read: _Read | None, fn, args, kwargs):
        if read is not None:
            self.watch.begin(read, fast_read_slot=self._gated)
        try:
            return fn(*args, **kwargs)
        finally:
            if read is not None:
                self.watch.finish(read)
                if self.max_calls is not None:
                    with self._calls_lock:
                        self._calls -= 1


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
