"""The image's health check script against a real gRPC health service on a free loopback port."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.manifests import DEPLOY

SCRIPT = DEPLOY / "docker" / "healthcheck.py"
SERVICE = "recserve.v1.Predictor"


def _load_script():
    spec = importlib.util.spec_from_file_location("healthcheck", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _port_without_server() -> Iterator[int]:
    """A loopback port that is bound (so nothing else takes it) but never listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def health_server() -> Iterator[tuple[health.HealthServicer, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(grace=None)


def test_script_exits_0_while_serving_and_1_when_not(health_server):
    servicer, port = health_server
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    env = {**os.environ, "RECSERVE_PORT": str(port)}  # the image's default target, 127.0.0.1:$RECSERVE_PORT
    run = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "SERVING" in run.stdout
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    run = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "NOT_SERVING" in run.stderr


def test_unknown_service_and_missing_server_are_unhealthy(health_server):
    servicer, port = health_server
    script = _load_script()
    target = f"127.0.0.1:{port}"
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert script.main(["--target", target, "--service", ""]) == 0
    serving, message = script.check(target, SERVICE, timeout=2.0)  # model not registered yet
    assert not serving and "NOT_FOUND" in message
    with _port_without_server() as free:
        serving, message = script.check(f"127.0.0.1:{free}", SERVICE, timeout=0.5)
    assert not serving and ("UNAVAILABLE" in message or "DEADLINE_EXCEEDED" in message)
