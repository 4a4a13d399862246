"""Hostile clients for the serving tests, speaking raw HTTP/2 frames (h2) and raw HTTP/1.1 on loopback.

Each attack runs in background threads, is bounded in connections and time, and stops by itself when the
``with`` block ends. A normal client beside it measures the effect.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc
import h2.config
import h2.connection
import h2.events

GRPC_HEADERS = [("content-type", "application/grpc"), ("te", "trailers")]
PREDICT = "/recserve.v1.Predictor/Predict"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@dataclass
class AttackStats:
    streams_opened: int = 0
    streams_reset: int = 0  # the server ended a stream (RST_STREAM or trailers) before we did
    connections_closed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class HeldStreams:
    """``connections`` HTTP/2 connections, each opening ``streams`` gRPC calls to ``method`` that send the
    5-byte message prefix and then one byte every ``interval_s`` (never END_STREAM, no ``grpc-timeout``).

    With ``send_prefix=False`` the streams send nothing after their headers (as a reflection stream that never
    asks). A stream the server ends is opened again, so the pressure stays for the whole hold.
    """

    def __init__(
        self,
        port: int,
        method: str,
        *,
        connections: int = 40,
        streams: int = 5,
        interval_s: float = 2.0,
        send_prefix: bool = True,
        declared_length: int = 1000,
        reopen: bool = True,
    ) -> None:
        self._port = port
        self._method = method
        self._connections = connections
        self._streams = streams
        self._interval_s = interval_s
        self._send_prefix = send_prefix
        self._declared_length = declared_length
        self._reopen = reopen
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.stats = AttackStats()

    def __enter__(self) -> HeldStreams:
        for i in range(self._connections):
            thread = threading.Thread(target=self._run, name=f"held-streams-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _open(self, conn: h2.connection.H2Connection) -> int:
        stream_id = conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", self._method),
            (":authority", f"127.0.0.1:{self._port}"),
            *GRPC_HEADERS,
        ]
        conn.send_headers(stream_id, headers)
        if self._send_prefix:
            conn.send_data(stream_id, b"\x00" + self._declared_length.to_bytes(4, "big"))
        with self._lock:
            self.stats.streams_opened += 1
        return stream_id

    def _run(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self._port), timeout=5)
        except OSError:
            return
        sock.settimeout(0.2)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.initiate_connection()
        open_streams = set()
        try:
            for _ in range(self._streams):
                open_streams.add(self._open(conn))
            sock.sendall(conn.data_to_send())
            next_byte = time.monotonic() + self._interval_s
            while not self._stop.is_set():
                try:
                    data = sock.recv(65536)
                    if not data:
                        with self._lock:
                            self.stats.connections_closed += 1
                        return
                    for event in conn.receive_data(data):
                        self._on_event(event, open_streams)
                except TimeoutError:
                    pass
                if self._reopen:
                    while len(open_streams) < self._streams and conn.open_outbound_streams < 100:
                        open_streams.add(self._open(conn))
                if self._send_prefix and time.monotonic() >= next_byte:
                    next_byte = time.monotonic() + self._interval_s
                    for stream_id in list(open_streams):
                        try:
                            conn.send_data(stream_id, b"\x01")
                        except Exception:  # the stream closed meanwhile
                            open_streams.discard(stream_id)
                sock.sendall(conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            with self._lock:
                self.stats.connections_closed += 1
        finally:
            sock.close()

    def _on_event(self, event, open_streams: set[int]) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            status = dict(event.headers).get("grpc-status")
            if status is not None:
                with self._lock:
                    self.stats.statuses[status] = self.stats.statuses.get(status, 0) + 1
        elif (
            isinstance(event, h2.events.StreamEnded | h2.events.StreamReset)
            and event.stream_id in open_streams
        ):
            open_streams.discard(event.stream_id)
            with self._lock:
                self.stats.streams_reset += 1


class SilentReflection:
    """``count`` ServerReflectionInfo streams from the stock gRPC client over ``channels`` connections that
    never send a request; one the server ends is opened again until the block ends."""

    def __init__(self, port: int, count: int = 200, channels: int = 40) -> None:
        opts = [("grpc.use_local_subchannel_pool", 1)]
        self._channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) for _ in range(channels)]
        self._count = count
        self._stop = threading.Event()
        self._calls: list = []
        self.opened = 0
        self.ended: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _silence(self):
        self._stop.wait()
        return
        yield  # a generator that never yields a request

    def _open(self, i: int):
        call = self._channels[i % len(self._channels)].stream_stream(REFLECTION)(self._silence())
        call.add_done_callback(self._done)
        self.opened += 1
        return call

    def _done(self, call) -> None:
        if not self._stop.is_set():
            code = call.code().name
            self.ended[code] = self.ended.get(code, 0) + 1

    def _run(self) -> None:
        self._calls = [self._open(i) for i in range(self._count)]
        while not self._stop.wait(0.5):
            for i, call in enumerate(self._calls):
                if call.done():
                    self._calls[i] = self._open(i)

    def __enter__(self) -> SilentReflection:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for call in self._calls:
            call.cancel()
        for channel in self._channels:
            channel.close()


def vm_kib(pid: int, field_name: str) -> int:
    """``VmRSS``/``VmHWM`` of a process in KiB, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def _held(port: int, seconds: float) -> None:
    """Issue 43's held streams for ``seconds``: 200 Predict streams over 40 raw HTTP/2 connections and 200
    silent reflection streams from the stock client over 40 more; prints what they saw as one JSON line."""
    with (
        HeldStreams(port, PREDICT, connections=40, streams=5) as predict,
        SilentReflection(port, count=200, channels=40) as reflection,
    ):
        time.sleep(seconds)
    stats = {
        "predict": dataclasses.asdict(predict.stats),
        "reflection": {"opened": reflection.opened, "ended": reflection.ended},
    }
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":  # python -m tests.serving.hostile held PORT SECONDS (bench/hostile.py runs it)
    _held(int(sys.argv[2]), float(sys.argv[3]))
