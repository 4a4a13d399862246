"""Admission control: a bounded count of RPCs in flight per worker, decided once a request has arrived.

The interceptor (:mod:`recserve.server.transports.status`) asks :class:`AdmissionLimit` as a unary handler
starts, i.e. once its request message is complete, so a client that never finishes a message holds no slot
(the read watch of :mod:`recserve.server.transports.reads` ends it). An RPC over the limit is answered
RESOURCE_EXHAUSTED at once. The limit is at most ``--grpc-threads``, so that every admitted RPC has a thread
and the queue that builds up under load is the batcher's, where deadlines are enforced. :class:`QueueLag`
refuses new RPCs on gRPC's polling thread, before anything is read, while calls wait too long for a thread.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time

import grpc

# Probes continue this long after the last call (a server at rest sends none).
ACTIVE_SECONDS = 1.0
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


class QueueLag:
    """How long a new RPC waits before gRPC Python sees it; above ``target_s``, new RPCs are refused.

    gRPC core queues calls that Python has not picked up yet, one queue per method, and sheds them only at
    thousands (as CANCELLED, unseen). When handlers hold the GIL, that queue grows faster than Python takes
    calls, and no in-flight limit sees it: a freed slot admits a call that already waited seconds. So per
    watched method a daemon thread sends a probe call to the server's own private socket every
    ``interval_s``, stamped with a per-process secret and its send time; the interceptor reads the stamp when
    the probe comes out of the queue (:meth:`is_probe`). The lag is the last probe's wait, or the wait of the
    probe still queued if longer. While it is above target, refusing every new call (microseconds each) lets
    the queue drain; the next probe through ends that.

    A server at rest has no queue to measure: probes are sent only while calls arrive (one seen within
    :data:`ACTIVE_SECONDS`), so an idle worker spends no CPU on them; the first call after a quiet spell
    wakes them.
    """

    HEADER = "x-recserve-lag-probe"

    def __init__(self, methods: tuple[str, ...], *, target_s: float = 0.1, interval_s: float = 0.05) -> None:
        self.methods = methods
        self.target_s = target_s
        self._interval_s = interval_s
        self._secret = secrets.token_hex(16)
        self._sent: dict[str, float | None] = dict.fromkeys(methods)  # send time of the probe in flight
        self._lag: dict[str, float] = dict.fromkeys(methods, 0.0)
        self._stop = threading.Event()
        self._active = threading.Event()  # set by a call arriving, cleared by the probes going quiet
        self._last_call = time.monotonic()
        self.probes = 0  # probes sent so far (none while the server is at rest)
        self._threads: list[threading.Thread] = []
        self._channel: grpc.Channel | None = None

    def start(self, address: str) -> None:
        """Probes the server listening on ``address`` (its private socket) until :meth:`stop`."""
        self._channel = grpc.insecure_channel(address)
        self._last_call = time.monotonic()  # the first second is probed: a server starts with a measured lag
        # One thread per method making blocking calls: a call made with ``future()`` starts a channel thread
        # each time (none lives between probes 50 ms apart), 40 thread starts a second in a busy process.
        for method in self.methods:
            call = self._channel.unary_unary(method)  # bytes in, bytes out
            thread = threading.Thread(
                target=self._run, args=(method, call), name="queue-lag-probe", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._active.set()  # wakes the probes that wait for calls
        if self._channel is not None:
            self._channel.close()  # ends a probe still waiting for its answer
        for thread in self._threads:
            thread.join()

    def is_probe(self, method: str, metadata) -> bool:
        """At interception: True for our own probe, whose queue wait is then recorded."""
        for key, value in metadata or ():
            if key == self.HEADER:
                secret, _, sent = value.partition(" ")
                if secret != self._secret or method not in self._lag:
                    return False
                stamp = float(sent)
                self._lag[method] = time.monotonic() - stamp
                # Out of the queue: its wait is measured. Whatever its answer then waits for is no lag of
                # the queue (and a probe answered late must not read as one still queued).
                if self._sent[method] == stamp:
                    self._sent[method] = None
                return True
        return False

    def lag_s(self) -> float:
        """The longest current wait over the watched methods (seconds)."""
        now = time.monotonic()
        worst = 0.0
        for method in self.methods:
            sent = self._sent[method]
            worst = max(worst, self._lag[method], 0.0 if sent is None else now - sent)
        return worst

    def overloaded(self) -> bool:
        """At interception of every admitted method's call: True while the lag is over target."""
        self._last_call = time.monotonic()
        if not self._active.is_set():
            self._active.set()
        return self.lag_s() > self.target_s

    def _quiet(self) -> bool:
        return time.monotonic() - self._last_call > ACTIVE_SECONDS

    def _run(self, method: str, call) -> None:
        while not self._stop.wait(self._interval_s):
            if self._quiet():
                self._active.clear()
                if self._quiet():  # a call that came between the test and the clear set it again
                    self._active.wait()
                continue
            sent = time.monotonic()
            self.probes += 1
            self._sent[method] = sent  # while it waits, the probe in the queue measures the lag
            try:
                call(b"", metadata=((self.HEADER, f"{self._secret} {sent!r}"),), timeout=60)
            except grpc.RpcError:
                pass  # stopping, or no answer in 60 s (a probe is never refused): lag_s() saw it wait
            except ValueError:  # grpc's "closed channel": stop() closed it between the wait and this call
                return
            finally:
                self._sent[method] = None


def answer_probe(request: bytes, context) -> bytes:
    """The reply to a queue-lag probe: nothing (it measured what it came for at interception)."""
    return b""


def private_socket() -> tuple[str, str]:
    """``(grpc address, directory)`` of a Unix socket only this user can reach, for the probes."""
    directory = tempfile.mkdtemp(prefix="recserve-probe-")  # mode 0700
    return f"unix:{os.path.join(directory, 'lag.sock')}", directory
