"""``ServeConfig``: everything ``recserve serve`` takes, checked once with messages naming the flag."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recserve.errors import RecServeError
from recserve.server.batcher import BatcherConfig


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
    workers: int = 1
    max_batch_size: int = 512
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 4096
    grpc_threads: int = 64
    max_message_bytes: int = 64 * 1024 * 1024
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    watch: Path | None = None
    watch_interval_s: float = 2.0
    drain_timeout_s: float = 30.0
    device: str = "cpu"
    torch_threads: int | None = None  # None: cores / workers

    def __post_init__(self) -> None:
        if self.package is None and self.watch is None:
            raise ServeConfigError(
                "--package: required unless --watch names a directory of versioned packages"
            )
        if not 0 <= self.port <= 65535:
            raise ServeConfigError(f"--port: expected 0..65535, got {self.port}")
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
        try:
            self.batcher_config()
        except ValueError as exc:
            raise ServeConfigError(f"batcher options: {exc}") from None

    def batcher_config(self) -> BatcherConfig:
        return BatcherConfig(
            max_batch_size=self.max_batch_size,
            max_queue_delay_s=self.max_queue_delay_ms / 1000.0,
            max_queue_size=self.max_queue_size,
        )
