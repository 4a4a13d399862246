"""``ServeConfig``: everything ``recserve serve`` takes, checked once with messages naming the flag."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from recserve.errors import RecServeError
from recserve.server.admission import default_max_inflight
from recserve.server.batcher import BatcherConfig

ADMIN_TOKEN_ENV = "RECSERVE_ADMIN_TOKEN"


class ServeConfigError(RecServeError, ValueError):
    """A ``recserve serve`` option is invalid."""


@dataclass(frozen=True)
class ServeConfig:
    """Server options; ``package`` may be None when ``watch`` names a directory of versioned packages."""

    package: Path | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = 9400  # None: no /metrics endpoint
    metrics_host: str = "127.0.0.1"
    http_port: int | None = None  # Open Inference Protocol REST on --host (None: off)
    workers: int = 1
    # With several workers on CPU, worker i runs on the i-th of N equal groups of the CPUs the server may use.
    pin_workers: bool = True
    max_batch_size: int = 512
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 4096
    grpc_threads: int = 64
    max_inflight: int | None = None  # None: default_max_inflight(grpc_threads, max_queue_size)
    max_queue_lag_ms: float = 100.0  # refuse new calls while calls wait longer to be seen (0: off)
    max_message_bytes: int = 64 * 1024 * 1024
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    watch: Path | None = None
    watch_interval_s: float = 2.0
    drain_timeout_s: float = 30.0
    device: str = "cpu"
    torch_threads: int | None = None  # None: cores / workers
    admin_host: str = "127.0.0.1"
    admin_port: int | None = 50052  # None: no admin service
    admin_token: str | None = None  # required in the metadata of admin calls when set
    reload_root: Path | None = None  # None: the --watch dir, else the --package dir's parent
    # Set by the parent of --workers N for each worker (recserve.server.control): model control is shared.
    worker_index: int = 0
    control_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.package is None and self.watch is None:
            raise ServeConfigError(
                "--package: required unless --watch names a directory of versioned packages"
            )
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
        if self.max_queue_lag_ms < 0:
            raise ServeConfigError(f"--max-queue-lag-ms: expected >= 0 (0: off), got {self.max_queue_lag_ms}")
        self._check_admin()
        try:
            self.batcher_config()
        except ValueError as exc:
            raise ServeConfigError(f"batcher options: {exc}") from None

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

    @property
    def effective_max_inflight(self) -> int:
        """The admission limit: ``max_inflight``, or the default derived from the threads and the queue."""
        if self.max_inflight is not None:
            return self.max_inflight
        return default_max_inflight(self.grpc_threads, self.max_queue_size)

    @property
    def effective_reload_root(self) -> Path | None:
        """The directory admin reloads may load from (symlinks resolved)."""
        root = self.reload_root or self.watch or (Path(self.package).parent if self.package else None)
        return None if root is None else Path(root).resolve()

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
