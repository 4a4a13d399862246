"""Every Prometheus metric the server exports, declared in one place, in seconds and with ``_total`` counters.

Latency buckets are fine below 1 ms and have a boundary at the 25 ms latency goal, so that
"share of requests within the goal" is exact. With several worker processes (``--workers N``) the values go
through prometheus_client's multiprocess mode: the parent sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts
the workers and serves one ``/metrics`` page that sums them (:func:`start_metrics_http_server`).
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

logger = logging.getLogger(__name__)

LATENCY_GOAL_SECONDS = 0.025
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02,
    LATENCY_GOAL_SECONDS, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
MODEL_TIMESTAMP = "recserve_model_timestamp_seconds"
FRESHNESS = "recserve_model_freshness_seconds"
# Why a delta was refused (recserve.server.operations.follow): recserve_model_deltas_refused_total's labels.
DELTA_REFUSALS = ("sequence", "base", "invalid", "apply")


class ServerMetrics:
    """The server's metrics, registered in ``registry`` (a fresh one by default, so tests can run several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.registry = r
        self.requests = Counter(
            "recserve_requests", "RPCs by method and status code", ["method", "code"], registry=r
        )
        self.request_latency = Histogram(
            "recserve_request_latency_seconds",
            "Time from receipt to reply, per RPC method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "recserve_inflight_requests", "RPCs being handled", registry=r, multiprocess_mode="livesum"
        )
        self.queue_depth_gauge = Gauge(
            "recserve_queue_depth", "Requests waiting in the batcher", registry=r, multiprocess_mode="livesum"
        )
        self.queue_wait = Histogram(
            "recserve_queue_wait_seconds",
            "Time a request waited for its batch",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "recserve_batch_size", "Examples per executed batch", buckets=BATCH_SIZE_BUCKETS, registry=r
        )
        self.inference = Histogram(
            "recserve_inference_seconds", "Predictor time per batch", buckets=LATENCY_BUCKETS, registry=r
        )
        self.examples = Counter("recserve_examples", "Examples scored", registry=r)
        self.model_info = Gauge(
            "recserve_model_info",
            "1 for the model version being served, 0 for versions swapped out",
            ["model", "version"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.nonfinite_scores = Counter(
            "recserve_nonfinite_scores",
            "Requests refused because the model's scores for them were not finite (NaN or infinite)",
            registry=r,
        )
        self.model_reloads = Counter(
            "recserve_model_reloads", "Model loads after start, by result", ["result"], registry=r
        )
        # The version serving: livemin, so that with several workers the page shows the one furthest behind.
        self.model_step = Gauge(
            "recserve_model_step",
            "Training step of the model version serving (its newest delta's, else its base's)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.model_timestamp = Gauge(
            MODEL_TIMESTAMP,
            "Unix time at which the trainer read the rows of the version serving (its newest delta's)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.deltas_applied = Counter(
            "recserve_model_deltas_applied", "Deltas applied to the served base (--follow)", registry=r
        )
        self.deltas_refused = Counter(
            "recserve_model_deltas_refused",
            "Deltas refused (--follow), by reason: " + ", ".join(DELTA_REFUSALS),
            ["reason"],
            registry=r,
        )
        # Recommendation pipelines (recserve.server.dataplane.recommend): each stage's time per batch.
        self.recommend_stage = Histogram(
            "recserve_recommend_stage_seconds",
            "Time of each pipeline stage (query, retrieval, ranking) per batch of Recommend requests",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recommend_candidates = Histogram(
            "recserve_recommend_candidates",
            "Candidates ranked per Recommend request",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self._wall_time: float | None = None
        r.register(_Freshness(lambda: self._wall_time))

    def recommend_batch_done(self, stage_seconds: dict[str, float], candidates: Sequence[int]) -> None:
        for stage, seconds in stage_seconds.items():
            self.recommend_stage.labels(stage).observe(seconds)
        for count in candidates:
            self.recommend_candidates.observe(count)

    # BatchObserver
    def queue_depth(self, requests: int) -> None:
        self.queue_depth_gauge.set(requests)

    def batch_done(self, examples: int, queue_waits: Sequence[float], seconds: float) -> None:
        self.batch_size.observe(examples)
        self.inference.observe(seconds)
        self.examples.inc(examples)
        for wait in queue_waits:
            self.queue_wait.observe(wait)

    def serving(self, model: str, version: str, previous: tuple[str, str] | None = None) -> None:
        """Marks ``model``/``version`` as served (and the one it replaced as not)."""
        if previous is not None and previous != (model, version):
            self.model_info.labels(*previous).set(0)
        self.model_info.labels(model, version).set(1)

    def model_state(self, step: int | None, wall_time: float | None) -> None:
        """The serving version's training step and its rows' wall time (None: the package does not say)."""
        if step is not None:
            self.model_step.set(step)
        if wall_time is not None and wall_time > 0:
            self.model_timestamp.set(wall_time)
            self._wall_time = wall_time


class _Freshness:
    """``recserve_model_freshness_seconds`` at scrape time: now minus ``wall_time()`` (no sample while it is
    unknown: a package that records no wall time, or a worker that has not reported one yet)."""

    def __init__(self, wall_time) -> None:
        self._wall_time = wall_time

    def describe(self) -> list[Metric]:
        return [_freshness_family()]

    def collect(self) -> Iterator[Metric]:
        wall_time = self._wall_time()
        family = _freshness_family()
        if wall_time is not None and wall_time > 0:
            family.add_metric([], max(0.0, time.time() - wall_time))
        yield family


def _freshness_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        FRESHNESS, "Seconds since the trainer read the rows of the version serving (computed at scrape)"
    )


class _WorkerFiles:
    """The workers' metric files summed, as prometheus_client's ``MultiProcessCollector`` sums them, and the
    freshness of the stalest worker from the same read.

    A file a worker is creating at this instant is left out: it is empty until prometheus_client sizes it,
    and reading it would fail the whole scrape (a ``struct.error``, HTTP 500) while a worker starts."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.multiprocess import MultiProcessCollector

        families = list(MultiProcessCollector.merge(self._files(), accumulate=True))
        yield from families
        stamps = [s.value for f in families if f.name == MODEL_TIMESTAMP for s in f.samples]
        # livemin: 0 while a live worker has not reported one, and then freshness is unknown.
        yield from _Freshness(lambda: min(stamps) if stamps else None).collect()

    def _files(self) -> list[str]:
        files = []
        for name in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(name) > 0:
                    files.append(name)
            except FileNotFoundError:
                pass  # a stopped worker's file, removed by mark_process_dead
        return files


def start_metrics_http_server(port: int, host: str, registry: CollectorRegistry | None) -> object:
    """Serves ``/metrics`` on ``host:port``; ``registry=None`` aggregates the worker processes' files.

    Returns the WSGI server (call ``.shutdown()`` to stop it).
    """
    if registry is None:
        registry = CollectorRegistry()
        registry.register(_WorkerFiles(os.environ[MULTIPROC_ENV]))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    logger.info("metrics on http://%s:%d/metrics", host, server.server_port)
    return server


def prepare_multiprocess_dir(path: Path) -> None:
    """Empties ``path`` and points prometheus_client's multiprocess mode at it (before workers start)."""
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
