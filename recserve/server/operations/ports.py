"""Binding the server's ports, with one line naming the flag and the port when it cannot be done.

gRPC reports a port it cannot bind with a RuntimeError and a log line of its own, HTTP servers with an
OSError and a traceback; a user needs to know which flag names the port and why. So every port is first
tried with a plain socket (``SO_REUSEPORT`` where the workers share it), and whatever still fails is turned
into :class:`StartupError`.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import TypeVar

import grpc

from recserve.errors import StartupError

T = TypeVar("T")


def _problem(error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return "address already in use (another server, or an earlier one still running?)"
    if error.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if error.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address"
    return error.strerror or str(error)


def check_bindable(flag: str, host: str, port: int, *, reuse_port: bool = False) -> None:
    """StartupError naming ``flag`` unless ``host:port`` can be bound now (port 0 always can)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise StartupError(f"{flag} {port} on {host}: cannot resolve the host ({error.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port and hasattr(socket, "SO_REUSEPORT"):
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise StartupError(f"{flag} {port} on {host}: cannot bind: {_problem(error)}") from None


def bind_grpc(
    server: grpc.Server,
    flag: str,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None,
    *,
    reuse_port: bool = False,
) -> int:
    """Adds ``host:port`` to ``server``; returns the bound port or raises StartupError naming ``flag``."""
    check_bindable(flag, host, port, reuse_port=reuse_port)
    address = f"{host}:{port}"
    try:
        bound = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise StartupError(f"{flag} {port} on {host}: gRPC could not bind {address}")
    return bound


def bind_with(flag: str, host: str, port: int, start: Callable[[], T]) -> T:
    """Runs ``start`` (which binds ``host:port``), turning an OSError into StartupError naming ``flag``."""
    try:
        return start()
    except OSError as error:
        raise StartupError(f"{flag} {port} on {host}: cannot bind: {_problem(error)}") from None
