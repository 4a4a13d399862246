"""``ServeConfig``: everything ``recserve serve`` takes, checked once with messages naming the flag."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from recserve.errors import RecServeError
from recserve.server.dataplane.batcher import BatcherConfig
from recserve.server.transports.admission import default_max_inflight
from recserve.server.transports.budget import default_request_budget

ADMIN_TOKEN_ENV = "RECSERVE_ADMIN_TOKEN"
# Triton's --model-control-mode values recserve takes: "none" (no load/unload on the serving ports) or
# "explicit" (Triton's repository load/unload there too, under the admin credentials); --watch is "poll".
MODEL_CONTROL_MODES = ("none", "explicit")


class ServeConfigError(RecServeError, ValueError):
    """A ``recserve serve`` option is invalid."""


@dataclass(frozen=True)
class HttpLimits:
    """What one slow or idle client may hold.

    ``read_timeout_s``: the longest a request body may take to arrive (HTTP 408 after it); a request counts
    against admission only once its body is in, so slow uploads never hold an in-flight slot. While it
    arrives its bytes are reserved from the worker's request memory budget (503 when that is spent).
    ``idle_timeout_s``: a connection that sends no complete request head for this long (at its start, or
    between keep-alive requests) is closed, so trickled headers cannot hold a socket.
    ``max_connections``: open connections at once. A connection arriving at the limit closes an idle one to
    make room: the one silent longest among those that never sent a complete request head, else the one
    silent longest between keep-alive requests (a connection that has just been accepted or answered is
    spared until the server has read what it sent). Only when every open connection has a request in
    progress is the new one answered 503 and closed. So idle and half-open sockets cannot lock clients out.
    """

    read_timeout_s: float = 30.0
    idle_timeout_s: float = 15.0
    max_connections: int = 1024

    def __post_init__(self) -> None:
        if self.read_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("HTTP read and idle timeouts must be > 0")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"


@dataclass(frozen=True)
class ServeConfig:
    """Server options; ``package`` is None when ``watch`` names a directory of versioned packages or
    ``follow`` a publish directory (bases and their deltas, docs/online.md)."""

    package: Path | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = 9400  # None: no /metrics endpoint
    metrics_host: str = "127.0.0.1"
    http_port: int | None = None  # Open Inference Protocol REST on --host (None: off)
    http_read_timeout_s: float = 30.0  # longest a request body may take to arrive
    http_idle_timeout_s: float = 15.0  # longest a connection may go without a complete request head
    http_max_connections: int = 1024
    workers: int = 1
    # With several workers on CPU, worker i runs on the i-th of N equal groups of the CPUs the server may use.
    pin_workers: bool = True
    max_batch_size: int = 512
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 4096
    grpc_threads: int = 64
    max_inflight: int | None = None  # None: default_max_inflight(grpc_threads, max_queue_size)
    max_queue_lag_ms: float = 100.0  # refuse new calls while calls wait longer to be seen (0: off)
    # Refuse a Recommend request queued behind more estimated work than this (0: off; see dataplane/recommend)
    max_recommend_queued_ms: float = 250.0
    max_message_bytes: int = 64 * 1024 * 1024
    # Bytes this worker's REST requests may hold at once (bodies, inflated bodies, decoded tensors); None:
    # derived from the worker's memory share (recserve.server.transports.budget.default_request_budget).
    request_memory_bytes: int | None = None
    # A gRPC call whose request message has not arrived this long after a thread started reading it is ended
    # (DEADLINE_EXCEEDED); until it has arrived it holds no in-flight slot and no budget.
    grpc_read_timeout_s: float = 5.0
    # Streaming calls (health Watch, reflection) at once per worker, on a pool of their own.
    max_streaming_calls: int = 16
    # gRPC connections: closed after this age (clients reconnect, so load spreads over new workers and pods,
    # and no connection lives for ever), or after this long without an RPC; pings find dead peers.
    grpc_max_connection_age_s: float = 3600.0
    grpc_max_connection_idle_s: float = 900.0
    grpc_keepalive_s: float = 60.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    watch: Path | None = None
    watch_interval_s: float = 2.0
    # A trainer's publish dir: newest base, then each new delta (recserve.server.operations.follow).
    follow: Path | None = None
    follow_interval_s: float = 0.2
    drain_timeout_s: float = 30.0
    device: str = "cpu"
    dense_dtype: str | None = None  # auto / fp32 / bf16 (recserve.runtime.dense_precision); None: auto
    torch_threads: int | None = None  # None: cores / workers
    admin_host: str = "127.0.0.1"
    admin_port: int | None = 50052  # None: no admin service
    admin_token: str | None = None  # required in the metadata of admin calls when set
    reload_root: Path | None = None  # None: the --watch dir, else the --package dir's parent
    model_control: str = "none"  # see MODEL_CONTROL_MODES
    # Set by the parent of --workers N per worker (recserve.server.operations.control): shared model control.
    worker_index: int = 0
    control_dir: Path | None = None

    def __post_init__(self) -> None:
        self._check_source()
        if not 0 <= self.port <= 65535:
            raise ServeConfigError(f"--port: expected 0..65535, got {self.port}")
        if self.http_port is not None:
            if not 0 <= self.http_port <= 65535:
                raise ServeConfigError(f"--http-port: expected 0..65535 or -1 (off), got {self.http_port}")
            if self.http_port == self.port != 0:
                raise ServeConfigError(f"--http-port: {self.http_port} is the gRPC --port; give another one")
            if self.workers > 1 and self.http_port == 0:
                raise ServeConfigError("--http-port: several --workers share one port, so give it (not 0)")
        if self.workers < 1:
            raise ServeConfigError(f"--workers: expected >= 1, got {self.workers}")
        if self.workers > 1 and self.port == 0:
            raise ServeConfigError("--port: several --workers share one port, so give it explicitly (not 0)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ServeConfigError("--tls-cert and --tls-key: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ServeConfigError("--tls-client-ca: needs --tls-cert and --tls-key")
        for flag, path in (
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
            ("--tls-client-ca", self.tls_client_ca),
        ):
            if path is not None and not Path(path).is_file():
                raise ServeConfigError(f"{flag}: {path} is not a file")
        if self.grpc_threads < 1:
            raise ServeConfigError(f"--grpc-threads: expected >= 1, got {self.grpc_threads}")
        if self.max_inflight is not None and not 1 <= self.max_inflight <= self.grpc_threads:
            raise ServeConfigError(
                f"--max-inflight: expected 1..--grpc-threads ({self.grpc_threads}), got {self.max_inflight}; "
                "an admitted request must find a handler thread at once, so raise --grpc-threads with it"
            )
        if self.request_memory_bytes is not None and self.request_memory_bytes < self.max_message_bytes:
            raise ServeConfigError(
                f"--request-memory-mb: {self.request_memory_bytes / 2**20:g} MiB is less than one request of "
                f"--max-message-mb ({self.max_message_bytes / 2**20:g} MiB)"
            )
        if not self.grpc_read_timeout_s > 0:
            raise ServeConfigError(
                f"--grpc-read-timeout: expected seconds > 0, got {self.grpc_read_timeout_s}"
            )
        if self.max_streaming_calls < 1:
            raise ServeConfigError(f"--max-streaming-calls: expected >= 1, got {self.max_streaming_calls}")
        if self.max_queue_lag_ms < 0:
            raise ServeConfigError(f"--max-queue-lag-ms: expected >= 0 (0: off), got {self.max_queue_lag_ms}")
        if self.max_recommend_queued_ms < 0:
            raise ServeConfigError(
                f"--max-recommend-queued-ms: expected >= 0 (0: off), got {self.max_recommend_queued_ms}"
            )
        self._check_admin()
        self._check_model_control()
        try:
            self.http_limits()
        except ValueError as exc:
            raise ServeConfigError(
                f"--http-read-timeout / --http-idle-timeout / --http-max-connections: {exc}"
            ) from None
        for flag, seconds in (
            ("--grpc-max-connection-age", self.grpc_max_connection_age_s),
            ("--grpc-max-connection-idle", self.grpc_max_connection_idle_s),
            ("--grpc-keepalive", self.grpc_keepalive_s),
        ):
            if seconds <= 0:
                raise ServeConfigError(f"{flag}: expected seconds > 0, got {seconds}")
        try:
            self.batcher_config()
        except ValueError as exc:
            raise ServeConfigError(f"batcher options: {exc}") from None

    def _check_source(self) -> None:
        """Exactly one of ``--package``, ``--watch`` (``--package`` may name the first version of it) and
        ``--follow`` says what serves."""
        if self.follow is not None:
            if self.watch is not None:
                raise ServeConfigError(
                    "--follow and --watch: give one; --follow DIR already serves DIR's newest base (as "
                    "--watch would) and applies its deltas as they land"
                )
            if self.package is not None:
                raise ServeConfigError(
                    "--follow and --package: give one; --follow DIR serves DIR's newest base package"
                )
            if not self.follow_interval_s > 0:
                raise ServeConfigError(
                    f"--follow-interval: expected seconds > 0, got {self.follow_interval_s}"
                )
        elif self.package is None and self.watch is None:
            raise ServeConfigError(
                "--package: required unless --watch names a directory of versioned packages or --follow a "
                "publish directory"
            )

    def _check_admin(self) -> None:
        if self.admin_port is None:
            return
        if not 0 <= self.admin_port <= 65535:
            raise ServeConfigError(f"--admin-port: expected 0..65535 or -1 (off), got {self.admin_port}")
        if self.workers > 1 and self.admin_port == 0:
            raise ServeConfigError(
                "--admin-port: several --workers share one port, so give it explicitly (not 0)"
            )
        if self.admin_port == self.port != 0:
            raise ServeConfigError(f"--admin-port: {self.admin_port} is the serving --port; give another one")
        if self.admin_token == "":
            raise ServeConfigError(
                f"--admin-token / {ADMIN_TOKEN_ENV}: empty; give a secret or leave it unset"
            )
        mutual_tls = self.tls_client_ca is not None
        if not is_loopback(self.admin_host) and self.admin_token is None and not mutual_tls:
            raise ServeConfigError(
                f"--admin-host {self.admin_host}: the admin service (model reload) listens beyond loopback "
                f"without authentication; set --admin-token (or {ADMIN_TOKEN_ENV}), require client "
                "certificates with --tls-client-ca, or bind it to 127.0.0.1"
            )

    def _check_model_control(self) -> None:
        if self.model_control not in MODEL_CONTROL_MODES:
            raise ServeConfigError(
                f"--model-control: expected one of {list(MODEL_CONTROL_MODES)}, got {self.model_control!r}"
            )
        if self.model_control == "none":
            return
        if self.versions_dir is not None:
            flag = "--watch" if self.watch is not None else "--follow"
            raise ServeConfigError(
                f"--model-control explicit: {flag} already decides what serves (Triton's poll mode); give one"
            )
        if not is_loopback(self.host) and self.admin_token is None and self.tls_client_ca is None:
            raise ServeConfigError(
                f"--model-control explicit: repository load/unload would be open to anyone who reaches "
                f"--host {self.host}; set --admin-token (or {ADMIN_TOKEN_ENV}) or --tls-client-ca, "
                "or bind to 127.0.0.1"
            )

    @property
    def versions_dir(self) -> Path | None:
        """The dir of numbered versions the server polls: ``--watch`` or ``--follow`` (None: neither)."""
        return self.watch if self.watch is not None else self.follow

    @property
    def effective_max_inflight(self) -> int:
        """The admission limit: ``max_inflight``, or the default derived from the threads and the queue."""
        if self.max_inflight is not None:
            return self.max_inflight
        return default_max_inflight(self.grpc_threads, self.max_queue_size)

    @property
    def effective_request_memory(self) -> int:
        """The worker's REST request memory budget (bytes): ``request_memory_bytes`` or the default."""
        if self.request_memory_bytes is not None:
            return self.request_memory_bytes
        return default_request_budget(self.workers, self.max_message_bytes)

    @property
    def effective_reload_root(self) -> Path | None:
        """The directory admin reloads may load from (symlinks resolved)."""
        root = self.reload_root or self.versions_dir or (Path(self.package).parent if self.package else None)
        return None if root is None else Path(root).resolve()

    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            read_timeout_s=self.http_read_timeout_s,
            idle_timeout_s=self.http_idle_timeout_s,
            max_connections=self.http_max_connections,
        )

    def batcher_config(self) -> BatcherConfig:
        return BatcherConfig(
            max_batch_size=self.max_batch_size,
            max_queue_delay_s=self.max_queue_delay_ms / 1000.0,
            max_queue_size=self.max_queue_size,
        )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); False for anything else."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
