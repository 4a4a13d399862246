"""A training run's Prometheus metrics (``train.metrics_port``; rank 0 serves ``/metrics``).

Gauges, on a registry of the run's own (no process-wide state): ``rectrain_step`` (optimizer steps taken),
``rectrain_examples`` (examples trained, all ranks), ``rectrain_progressive_auc``,
``rectrain_progressive_ne`` and ``rectrain_progressive_examples`` (the window they were computed over).
Steps and examples continue from a resumed checkpoint's, so they are gauges, not counters.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)

_GAUGES = {
    "step": "Optimizer steps the run has taken",
    "examples": "Examples trained on, all ranks",
    "progressive_auc": "AUC of the latest examples, scored before training on them",
    "progressive_ne": "Normalized entropy of the latest examples, scored before training on them",
    "progressive_examples": "Examples in the progressive window",
}


class MetricsExporter:
    """Serves the run's gauges on ``port`` (all interfaces) until ``close``."""

    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry()
        self._gauges = {k: Gauge(f"rectrain_{k}", doc, registry=self.registry) for k, doc in _GAUGES.items()}
        try:
            self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            raise ConfigError(f"train.metrics_port: cannot serve metrics on {addr}:{port}: {e}") from None
        self.port = self._server.server_port
        logger.info("Prometheus metrics on http://%s:%d/metrics", addr, self.port)

    def set(self, **values: float) -> None:
        """Set gauges by their short names (``step=..., progressive_auc=...``)."""
        for name, value in values.items():
            self._gauges[name].set(value)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
