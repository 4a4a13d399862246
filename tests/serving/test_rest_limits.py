"""REST memory and connections stay bounded under the attacks of issue 43, measured beside a normal client.

Each attack is scaled down (tens of connections, a 64 MiB request memory budget, 16 MiB messages, seconds of
hold); memory is asserted with the budget's own accounting and with this process's resident memory, which
must not grow past the budget plus a constant (``RSS_SLACK``) for the interpreter, the sockets and the
allocator.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import socket
import threading
import time
import zlib
from pathlib import Path

import requests

from recserve.server.transports.rest_connections import ConnectionPool

from .conftest import random_batch, request_counts, running_server, wait_for
from .test_rest import json_body

MIB = 1 << 20
BUDGET = 64 * MIB
MAX_MESSAGE = 16 * MIB
RSS_SLACK = 96 * MIB
INFER = "/v2/models/tiny/infer"


@contextlib.contextmanager
def limited_server(package, **overrides):
    """A server whose REST side has a 64 MiB request memory budget and takes messages up to 16 MiB."""
    limits = {"request_memory_bytes": BUDGET, "max_message_bytes": MAX_MESSAGE, "max_queue_delay_ms": 1}
    with running_server(package, **{**limits, **overrides}) as server:
        assert budget_of(server).limit == BUDGET  # the server's budget is the one REST reserves from
        yield server


def budget_of(server):
    return server._rest._api.budget


def url(server, path: str = INFER) -> str:
    return f"http://127.0.0.1:{server.http_port}{path}"


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(length: int, encoding: str | None = None, path: str = INFER) -> bytes:
    coding = f"Content-Encoding: {encoding}\r\n" if encoding else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{coding}"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def padded_body(nbytes: int, seed: int = 0) -> bytes:
    """A valid infer request padded with JSON whitespace to ``nbytes``."""
    body = json.dumps(json_body(*random_batch(2, seed=seed))).encode()
    return body + b" " * (nbytes - len(body))


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class PeakRss:
    """The most resident memory this process had while the block ran, sampled every 10 ms."""

    def __init__(self) -> None:
        self.start = rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


def normal_client(server, seconds: float) -> tuple[int, list[str]]:
    """Valid requests for ``seconds``: how many were answered, and every failure."""
    dense, kjt = random_batch(3, seed=5)
    answered, failures = 0, []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            r = requests.post(url(server), json=json_body(dense, kjt), timeout=10)
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text[:200]}")
        except requests.RequestException as exc:
            failures.append(repr(exc))
        answered += 1
    return answered, failures


def test_stalled_gzip_uploads_hold_their_compressed_bytes_not_what_they_inflate_to(package):
    """40 connections send 15 MB of JSON gzipped to ~15 kB, announce 1,000 bytes more, then wait."""
    bomb = gzip.compress(b'{"inputs": [' + b" " * (15 * MIB), 9)
    with limited_server(package, http_read_timeout_s=3.0) as server, PeakRss() as memory:
        budget = budget_of(server)
        socks = [connect(server) for _ in range(40)]
        for sock in socks:
            sock.sendall(head(len(bomb) + 1000, "gzip") + bomb)
        try:
            assert wait_for(lambda: budget.used >= 40 * len(bomb), 10)
            answered, failures = normal_client(server, 1.5)  # while all 40 stall
            assert answered >= 3 and failures == []
            assert budget.used <= 40 * len(bomb) + 8 * MIB  # compressed bytes (and the normal client's)
            for sock in socks[:5]:  # past --http-read-timeout each stalled upload is answered 408
                sock.settimeout(15)
                assert sock.recv(200).startswith(b"HTTP/1.1 408")
            assert wait_for(
                lambda: request_counts(server, "rest/ModelInfer").get("DEADLINE_EXCEEDED", 0) >= 40, 15
            )
            assert wait_for(lambda: budget.used == 0, 10)
        finally:
            for sock in socks:
                sock.close()
    assert budget.peak <= budget.limit
    assert memory.growth < 40 * len(bomb) + RSS_SLACK, memory.growth  # 40 x 15 MB inflated would be 600 MB


def test_a_body_that_inflates_past_the_message_limit_is_413_without_inflating_it(package):
    bomb = gzip.compress(b" " * (200 * MIB), 9)  # 200 KB on the wire
    with limited_server(package) as server, PeakRss() as memory:
        budget = budget_of(server)
        for _ in range(5):
            headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
            r = requests.post(url(server), data=bomb, headers=headers, timeout=30)
            assert r.status_code == 413, r.text
            assert "inflates to more than 16777216 bytes" in r.json()["error"]
        assert budget.used == 0
    # The inflated bytes that were reserved never passed the message limit (plus the compressed body).
    assert budget.peak <= MAX_MESSAGE + 2 * len(bomb)  # the compressed body is joined from its chunks
    assert memory.growth < BUDGET + RSS_SLACK, memory.growth


def test_gzip_and_deflate_bodies_are_inflated_and_served(package):
    dense, kjt = random_batch(4, seed=9)
    plain = json.dumps(json_body(dense, kjt)).encode()
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    bodies = {
        "gzip": gzip.compress(plain),
        "x-gzip": gzip.compress(plain[:100]) + gzip.compress(plain[100:]),  # two gzip members
        "deflate": zlib.compress(plain),
        "identity": plain,
    }
    with limited_server(package) as server:
        expected = requests.post(url(server), data=plain, timeout=10).json()["outputs"]
        deflated = raw_deflate.compress(plain) + raw_deflate.flush()
        for coding, body in [*bodies.items(), ("deflate", deflated)]:
            r = requests.post(url(server), data=body, headers={"Content-Encoding": coding}, timeout=10)
            assert r.status_code == 200 and r.json()["outputs"] == expected, (coding, r.text)
        assert budget_of(server).used == 0


def test_bodies_over_the_message_limit_are_413(package):
    with limited_server(package) as server:
        big = b" " * (MAX_MESSAGE + 1)
        r = requests.post(url(server), data=big, timeout=30)
        assert r.status_code == 413 and "Content-Length" in r.json()["error"], r.text
        chunked = requests.post(url(server), data=iter([big[: 8 * MIB], big[8 * MIB :]]), timeout=30)
        assert chunked.status_code == 413 and "more than 16777216 bytes" in chunked.json()["error"]
        assert request_counts(server, "rest/ModelInfer").get("RESOURCE_EXHAUSTED") == 2
        assert requests.post(url(server), data=padded_body(MAX_MESSAGE), timeout=30).status_code == 200


def test_a_spent_budget_answers_503_with_retry_after_until_it_is_returned(package):
    """Four stalled uploads hold 4 x 15 MiB of the 64 MiB; a 5 MiB request cannot reserve its bytes."""
    with limited_server(package, http_read_timeout_s=3.0) as server:
        budget = budget_of(server)
        socks = [connect(server) for _ in range(4)]
        for sock in socks:
            sock.sendall(head(16 * MIB) + b" " * (15 * MIB))
        try:
            assert wait_for(lambda: budget.used >= 60 * MIB, 10)
            r = requests.post(url(server), data=padded_body(5 * MIB), timeout=30)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
            assert "--request-memory-mb" in r.json()["error"]
            assert request_counts(server, "rest/ModelInfer").get("RESOURCE_EXHAUSTED") == 1
            assert wait_for(lambda: budget.used == 0, 15)  # the stalled uploads timed out (408)
            assert requests.post(url(server), data=padded_body(5 * MIB), timeout=30).status_code == 200
        finally:
            for sock in socks:
                sock.close()
    assert budget.peak <= budget.limit


def test_clients_looping_large_requests_stay_within_the_budget(package):
    """Eight clients send valid 8 MiB requests back to back: each fits the budget or is told to retry."""
    body = padded_body(8 * MIB)
    statuses: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                r = session.post(url(server), data=body, timeout=30)
                statuses.append((r.status_code, r.headers.get("Retry-After")))

    with limited_server(package) as server, PeakRss() as memory:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(4)
        stop.set()
        for t in threads:
            t.join(60)
        budget = budget_of(server)
        assert wait_for(lambda: budget.used == 0, 10)
    assert set(statuses) <= {(200, None), (503, "1")} and statuses.count((200, None)) >= 4, statuses
    assert budget.peak <= budget.limit
    # 8 bodies of 8 MiB are held by the clients themselves: one shared bytes object.
    assert memory.growth < BUDGET + RSS_SLACK, memory.growth


def test_idle_connections_do_not_lock_out_normal_clients(package):
    """2,200 idle connections (half with half a request head) against a 64-connection cap: a client with a
    new connection per request and one with a kept-alive connection are served all along."""
    with running_server(package, http_max_connections=64, max_queue_delay_ms=1) as server:
        pool = server._rest.connections
        opened: list[socket.socket] = []

        def attack() -> None:
            for i in range(2200):
                sock = connect(server)
                if i % 2:
                    sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: loc")
                opened.append(sock)

        attacker = threading.Thread(target=attack, daemon=True)
        dense, kjt = random_batch(3, seed=5)
        failures, answered = [], 0
        try:
            attacker.start()
            until = time.monotonic() + 60
            with requests.Session() as keep_alive:
                # Until the server has taken every attacking connection (each one closing an idle one).
                while (pool.closed_idle < 2200 - 64 or answered < 20) and time.monotonic() < until:
                    for post in (requests.post, keep_alive.post):
                        try:
                            r = post(url(server), json=json_body(dense, kjt), timeout=10)
                            if r.status_code != 200:
                                failures.append(f"{r.status_code} {r.text[:200]}")
                        except requests.RequestException as exc:
                            failures.append(repr(exc))
                        answered += 1
            attacker.join(60)
            assert len(opened) == 2200 and pool.closed_idle >= 2200 - 64 and len(pool) <= 64
            assert failures == [] and answered >= 20, failures[:5]
            assert "RESOURCE_EXHAUSTED" not in request_counts(server, "rest/connection")
        finally:
            for sock in opened:
                sock.close()


def test_malformed_http_is_400_and_logged_once_per_interval(package, caplog):
    garbage = [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n",
        b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n",
    ]
    with running_server(package) as server, caplog.at_level(logging.DEBUG):
        for i in range(40):
            sock = connect(server)
            sock.sendall(garbage[i % len(garbage)])
            sock.settimeout(10)
            assert sock.recv(100).split(b"\r\n")[0].endswith(b" 400 Bad Request"), i
            sock.close()
        assert wait_for(lambda: request_counts(server, "rest/malformed").get("INVALID_ARGUMENT") == 40, 10)
        assert requests.get(url(server, "/v2/health/ready"), timeout=10).status_code == 200
    assert not [r for r in caplog.records if r.name.startswith("aiohttp")], caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    # Other tests' gRPC servers in this process may log their own (gRPC) undecodable lines meanwhile.
    messages = [r.getMessage() for r in caplog.records]
    lines = [m for m in messages if "undecodable request" in m and "HTTP request" in m]
    assert len(lines) == 1, caplog.text


def test_a_body_that_does_not_decode_under_its_content_encoding_is_400(package, caplog):
    with limited_server(package) as server, caplog.at_level(logging.WARNING):
        plain = json.dumps(json_body(*random_batch(2))).encode()
        cases = [
            ("gzip", plain, "Content-Encoding: gzip: the request body is not gzip data"),
            ("deflate", b"\x78\x9c garbage", "Content-Encoding: deflate: the request body is not deflate"),
            ("gzip", gzip.compress(plain)[:-20], "ends before the compressed stream does"),
            ("br", plain, "Content-Encoding: 'br' is not supported"),
        ]
        for coding, body, message in cases:
            r = requests.post(url(server), data=body, headers={"Content-Encoding": coding}, timeout=10)
            assert r.status_code == 400 and message in r.json()["error"], (coding, r.text)
        assert request_counts(server, "rest/ModelInfer") == {"INVALID_ARGUMENT": 4}
        assert budget_of(server).used == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_get_on_infer_is_405_with_allow_post(package):
    with running_server(package) as server:
        for path in (INFER, "/v2/models/tiny/versions/1/infer"):
            r = requests.get(url(server, path), timeout=10)
            assert r.status_code == 405 and r.headers["Allow"] == "POST", r.text
            assert "GET" in r.json()["error"] and "POST" in r.json()["error"]
        r = requests.post(url(server, "/v2/health/live"), timeout=10)
        assert r.status_code == 405 and "GET" in r.headers["Allow"]


def test_binary_data_size_must_be_an_integer(package):
    with running_server(package) as server:
        for size in ("208", 2.5, True, -1):
            doc = {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [2, 4]}]}
            doc["inputs"][0]["parameters"] = {"binary_data_size": size}
            head_json = json.dumps(doc).encode()
            headers = {"Inference-Header-Content-Length": str(len(head_json))}
            r = requests.post(url(server), data=head_json + b"\0" * 32, headers=headers, timeout=10)
            error = r.json()["error"]
            assert r.status_code == 400 and "inputs[0].parameters.binary_data_size" in error, (size, r.text)
            assert "must be an integer" in error


class _FakeHandler:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def force_close(self) -> None:
        self.closed = True


def test_the_pool_closes_the_longest_silent_never_used_connection_first():
    async def scenario() -> None:
        pool = ConnectionPool(3)
        a, b, c, d, e, f = (_FakeHandler(n) for n in "abcdef")
        for h in (a, b, c):
            assert pool.admit(h) and pool.connected(h)
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # each has been polled: no longer spared
        pool.busy(a)
        pool.done(a)  # a served a request and is kept alive
        pool.heard(b)  # b sent part of a head: c is now silent longest
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert pool.admit(d) and c.closed and not (a.closed or b.closed)
        assert pool.connected(d)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert pool.admit(e) and b.closed and not a.closed  # never-used ones go before kept-alive ones
        assert not pool.connected(b)  # closed to make room before it was connected: the caller closes it
        pool.busy(d)
        pool.busy(e)
        assert pool.admit(f) and a.closed  # only the kept-alive one was idle
        pool.busy(f)
        assert not pool.admit(_FakeHandler("g"))  # every connection busy: refused
        assert len(pool) == 3 and pool.closed_idle == 3

    asyncio.run(scenario())


def test_a_connection_just_accepted_or_answered_is_spared_until_polled():
    async def polled() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def scenario() -> None:
        pool = ConnectionPool(2)
        old, new, newer, last = (_FakeHandler(n) for n in ("old", "new", "newer", "last"))
        assert pool.admit(old) and pool.connected(old)
        await polled()
        pool.busy(old)
        pool.done(old)  # just answered: spared although it has been silent longest
        assert pool.admit(new) and pool.connected(new)  # spared until the loop has read it
        assert pool.admit(newer)  # none unspared: the limit still holds, a never-used one goes first
        assert new.closed and not old.closed
        assert pool.connected(newer)
        pool.busy(newer)
        await polled()  # old's next request did not come: it may go now
        assert pool.admit(last) and old.closed

    asyncio.run(scenario())
