"""Slow and idle clients cannot hold capacity: trickled REST bodies and heads, vanished clients, a cap.

Raw sockets play the hostile clients (an infer request that announces a 100 kB body and sends a byte at a
time); ``requests`` and gRPC play the normal client that must keep getting answers meanwhile.
"""

import contextlib
import logging
import socket
import threading
import time

import grpc
import requests

from recserve.server.operations.app import connection_options
from recserve.server.operations.config import ServeConfig
from recserve.server.transports.protos import oip_pb2_grpc

from .conftest import random_batch, request_counts, running_server, target, wait_for
from .test_oip import infer_request
from .test_rest import json_body

HEAD = (
    b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100000\r\n\r\n"
)


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    """A byte of body on every connection each 0.5 s, as the hostile clients did."""
    while not stop.wait(0.5):
        for sock in socks:
            with contextlib.suppress(OSError):  # the server cut it off: that is the point
                sock.send(b" ")


def test_200_trickling_uploads_do_not_slow_a_normal_client(package):
    with running_server(package, max_queue_delay_ms=1, http_read_timeout_s=4.0) as server:
        socks = [_connect(server) for _ in range(200)]
        for sock in socks:
            sock.sendall(HEAD + b'{"inputs": ')
        stop = threading.Event()
        trickler = threading.Thread(target=_trickle, args=(socks, stop), daemon=True)
        trickler.start()
        try:
            dense, kjt = random_batch(4, seed=2)
            url = f"http://127.0.0.1:{server.http_port}/v2/models/tiny/infer"
            errors, answered = 0, 0
            with grpc.insecure_channel(target(server)) as channel:
                stub = oip_pb2_grpc.GRPCInferenceServiceStub(channel)
                until = time.monotonic() + 3.0  # while all 200 hold their connections
                while time.monotonic() < until:
                    # Deadlines generous for a loaded CI machine: the failure this guards against is every
                    # call refused (RESOURCE_EXHAUSTED) while the tricklers hold the slots.
                    rest = requests.post(url, json=json_body(dense, kjt), timeout=10)
                    errors += rest.status_code != 200
                    try:
                        stub.ModelInfer(infer_request(dense, kjt, raw=True), timeout=10)
                    except grpc.RpcError:
                        errors += 1
                    answered += 2
            assert answered >= 10 and errors == 0
            # Past --http-read-timeout every trickler is answered 408 and counted, never INTERNAL.
            assert wait_for(
                lambda: request_counts(server, "rest/ModelInfer").get("DEADLINE_EXCEEDED", 0) >= 200, 15
            )
            assert "INTERNAL" not in request_counts(server, "rest/ModelInfer")
            replies = [sock.recv(200) for sock in socks[:5]]
            assert all(r.startswith(b"HTTP/1.1 408") for r in replies), replies
        finally:
            stop.set()
            trickler.join()
            for sock in socks:
                sock.close()


def test_a_client_that_leaves_mid_body_is_cancelled_without_a_traceback(package, caplog):
    with running_server(package) as server, caplog.at_level(logging.ERROR):
        sock = _connect(server)
        sock.sendall(HEAD + b'{"inputs": [')
        time.sleep(0.3)
        sock.close()
        assert wait_for(lambda: request_counts(server, "rest/ModelInfer").get("CANCELLED", 0) == 1, 10)
        assert "INTERNAL" not in request_counts(server, "rest/ModelInfer")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_idle_connections_and_trickled_heads_are_closed(package):
    with running_server(package, http_idle_timeout_s=1.0) as server:
        idle, slow_head = _connect(server), _connect(server)
        slow_head.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: loc")
        started = time.monotonic()
        for sock in (idle, slow_head):
            sock.settimeout(10)
            assert sock.recv(100) == b""  # the server closed it
        assert time.monotonic() - started < 8
        idle.close()
        slow_head.close()


def test_at_the_connection_limit_idle_connections_make_room_and_busy_ones_do_not(package):
    with running_server(package, http_max_connections=3, http_read_timeout_s=5.0) as server:
        idle = [_connect(server) for _ in range(3)]
        time.sleep(0.3)  # the server has taken all three
        ready = f"http://127.0.0.1:{server.http_port}/v2/health/ready"
        sessions = [requests.Session() for _ in idle]
        for sock, session in zip(idle, sessions):  # each new client closes the connection silent longest
            assert session.get(ready, timeout=10).status_code == 200  # and keeps its own open
            sock.settimeout(10)
            assert sock.recv(100) == b""
        for session in sessions:  # kept-alive idle connections make room too
            session.close()
        # Three uploads in progress are busy: a fourth connection is answered 503 at once.
        busy = [_connect(server) for _ in range(3)]
        for sock in busy:
            sock.sendall(HEAD + b'{"inputs": ')
        time.sleep(0.3)
        extra = _connect(server)
        extra.settimeout(10)
        reply = extra.recv(1000)
        assert reply.startswith(b"HTTP/1.1 503") and b"open HTTP connections, all busy" in reply
        assert request_counts(server, "rest/connection") == {"RESOURCE_EXHAUSTED": 1.0}
        for sock in [*idle, *busy, extra]:
            sock.close()
        assert wait_for(lambda: requests.get(ready, timeout=5).status_code == 200, 10)


def test_grpc_connections_have_keepalive_and_a_maximum_age(package):
    cfg = ServeConfig(package=package, grpc_max_connection_age_s=600, grpc_max_connection_idle_s=60)
    options = dict(connection_options(cfg))
    assert options["grpc.max_connection_age_ms"] == 600_000
    assert options["grpc.max_connection_idle_ms"] == 60_000
    assert options["grpc.max_connection_age_grace_ms"] == int(cfg.drain_timeout_s * 1000)
    assert options["grpc.keepalive_time_ms"] == 60_000 and options["grpc.keepalive_timeout_ms"] > 0
