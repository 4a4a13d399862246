"""Assembles and runs one server process: model → core → gRPC services (+ health, reflection) → signals.

Start-up order: load and warm up the package, build the core, bind the port, start serving, then report
SERVING on the health service (so readiness means "answers at full speed"). Shutdown (SIGTERM/SIGINT): health
goes NOT_SERVING, the port stops accepting RPCs, RPCs in flight and queued requests finish, then exit 0.
The admin service (reload) is a second gRPC server on its own port (:mod:`recserve.server.operations.admin`).
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import threading
from dataclasses import replace
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from recserve.errors import StartupError
from recserve.recommend.manifest import is_pipeline
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.batcher import BatcherConfig
from recserve.server.dataplane.core import InferenceCore
from recserve.server.dataplane.recommend import RecommendService
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.operations.admin import build_admin_server
from recserve.server.operations.config import ServeConfig
from recserve.server.operations.control import ModelControl, SharedControl
from recserve.server.operations.follow import Follower
from recserve.server.operations.metrics import ServerMetrics, start_metrics_http_server
from recserve.server.operations.ports import bind_grpc, bind_with
from recserve.server.operations.reload import Reloader, check_version_dir, newest_version_dir
from recserve.server.transports.admission import AdmissionLimit, QueueLag, private_socket
from recserve.server.transports.budget import MemoryBudget, ProcessMemory
from recserve.server.transports.handlers import DecodeFailureLog, add_service
from recserve.server.transports.oip import InferenceServicer
from recserve.server.transports.oip_recommend import PipelineModel
from recserve.server.transports.protos import OIP_SERVICE, PREDICTOR_SERVICE, oip_pb2, pb2, reflection_pool
from recserve.server.transports.reads import ReadWatch, WatchedPool, fast_read_slots, read_memory_limit
from recserve.server.transports.rest import RestApi, RestServer
from recserve.server.transports.servicer import PredictorServicer
from recserve.server.transports.status import StatusInterceptor
from recserve.server.transports.triton_ext import Repository

logger = logging.getLogger(__name__)

HEALTH_SERVICES = ("", PREDICTOR_SERVICE, OIP_SERVICE)
_MAX_PENDING_CALLS = 1 << 20
# Pool threads beyond --grpc-threads for calls whose request message is still arriving.
READING_THREADS = 256
# Streaming calls (health Watch, reflection) running or queued per worker: this many times
# --max-streaming-calls; more are refused as they arrive.
STREAMING_QUEUE_FACTOR = 4
# Room in gRPC's count of RPCs in flight for refusals on the shed pool and the queue-lag probes.
SHED_CALLS = 64


def load_runner(
    package_dir: Path,
    batcher_config: BatcherConfig,
    metrics: ServerMetrics,
    device: str = "cpu",
    dense_dtype: str | None = None,
) -> ModelRunner:
    """Loads a package with ``recserve.runtime.Predictor`` and warms it up behind a fresh batcher."""
    from recserve.runtime import Predictor

    predictor = Predictor.load(package_dir, device=device, dense_dtype=dense_dtype)
    runner = ModelRunner(
        predictor,
        batcher_config,
        observer=metrics,
        package_dir=Path(package_dir),
        on_nonfinite=metrics.nonfinite_scores.inc,
    )
    try:
        runner.warmup()
    except Exception:
        runner.close()
        raise
    return runner


def load_recommender(
    pipeline_dir: Path, metrics: ServerMetrics, max_queued_ms: float = 250.0
) -> RecommendService:
    """Loads a pipeline package (every file verified) behind its own batcher, and warms it up."""
    from recserve.recommend.index import set_search_threads
    from recserve.recommend.pipeline import RecommendPipeline

    # The index searches on as many threads as torch computes on (one per worker when the CPUs are shared
    # out between workers): faiss's default, every CPU in each worker, oversubscribes them.
    set_search_threads(torch.get_num_threads())
    service = RecommendService(
        RecommendPipeline.load(pipeline_dir), metrics, max_queued_s=max_queued_ms / 1000.0
    )
    plan = service.pipeline.plan
    # Warm-up: one request of an all-zero user through every stage.
    warm = FeatureArrays(
        batch_size=1,
        dense=torch.zeros(plan.user_dense),
        keys=list(plan.user_features),
        lengths=torch.ones(len(plan.user_features), dtype=torch.int32),
        values=torch.zeros(len(plan.user_features), dtype=torch.int64),
    )
    service.recommend(service.check(warm))
    return service


def _server_credentials(cfg: ServeConfig) -> grpc.ServerCredentials:
    assert cfg.tls_cert is not None and cfg.tls_key is not None
    ca = Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def connection_options(cfg: ServeConfig) -> list[tuple[str, int]]:
    """gRPC channel arguments that bound what one client's connection may hold, and for how long."""

    def ms(seconds: float) -> int:
        return int(seconds * 1000)

    return [
        ("grpc.max_connection_age_ms", ms(cfg.grpc_max_connection_age_s)),
        # RPCs in flight when a connection reaches its age get the drain timeout to finish.
        ("grpc.max_connection_age_grace_ms", ms(cfg.drain_timeout_s)),
        ("grpc.max_connection_idle_ms", ms(cfg.grpc_max_connection_idle_s)),
        ("grpc.keepalive_time_ms", ms(cfg.grpc_keepalive_s)),
        ("grpc.keepalive_timeout_ms", 20_000),
        # Clients that keep their connection alive with pings (every 10 s or slower) are not cut off.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


class RecServer:
    """One serving process: ``start()`` binds and serves, ``stop()`` drains, ``port`` is the bound port."""

    def __init__(self, cfg: ServeConfig, metrics: ServerMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ServerMetrics()
        versions = cfg.versions_dir
        package = cfg.package if cfg.package is not None else newest_version_dir(Path(versions))
        if package is None:
            flag = "--watch" if cfg.watch is not None else "--follow"
            raise StartupError(f"{flag} {versions}: no numbered version directory holds a manifest.json")
        check_version_dir(Path(package), versions)
        # A pipeline package serves Recommend, and its ranking package serves Predict (docs/recommend.md).
        self.recommender = None
        if is_pipeline(package):
            self.recommender = load_recommender(Path(package), self.metrics, cfg.max_recommend_queued_ms)
            package = Path(package) / "ranking"
        bc = cfg.batcher_config()
        # --follow: every base loaded (this one, and each one after) first catches up on its deltas.
        self.follower = None
        if cfg.follow is not None:
            self.follower = Follower(cfg.follow, self.metrics, interval_s=cfg.follow_interval_s)

        def load(path: Path) -> ModelRunner:
            runner = load_runner(path, bc, self.metrics, cfg.device, cfg.dense_dtype)
            return runner if self.follower is None else self.follower.load(runner)

        runner = load(Path(package))
        self.core = InferenceCore(runner)
        self.metrics.serving(*runner.model_id)
        self.metrics.model_state(runner.step, runner.wall_time)
        self.reloader = Reloader(
            self.core, load, self.metrics, watch_dir=versions, interval_s=cfg.watch_interval_s
        )
        # Reload, load and unload change the model of every worker, whichever one the call reached.
        self.control: ModelControl = self.reloader
        if cfg.control_dir is not None:
            self.control = SharedControl(self.reloader, cfg.control_dir, cfg.worker_index, cfg.workers)
        self.repository = Repository(
            self.core,
            self.control,
            cfg.effective_reload_root,
            polling=versions is not None,
            explicit=cfg.model_control == "explicit",
            token=cfg.admin_token,
        )
        self.health = health.HealthServicer()
        self.reloader.on_change = self._model_health
        self.admission = AdmissionLimit(cfg.effective_max_inflight)
        self.lag = None
        if cfg.max_queue_lag_ms > 0:
            watched = (f"/{PREDICTOR_SERVICE}/Predict", f"/{OIP_SERVICE}/ModelInfer")
            self.lag = QueueLag(watched, target_s=cfg.max_queue_lag_ms / 1000.0)
        # One budget for what requests hold once arrived, over gRPC and REST alike; gRPC messages stream into
        # memory at full speed a few at a time (recserve.server.transports.reads).
        self.budget = MemoryBudget(cfg.effective_request_memory)
        self.read_watch = ReadWatch(
            read_timeout_s=cfg.grpc_read_timeout_s,
            fast_reads=fast_read_slots(cfg.effective_request_memory, cfg.max_message_bytes),
            memory=ProcessMemory(),
            memory_limit=read_memory_limit(cfg.effective_request_memory),
            max_message_bytes=cfg.max_message_bytes,
            budget=self.budget,
        )
        self._shed_pool = WatchedPool(2, self.read_watch, thread_name_prefix="grpc-shed", gated=False)
        self._streaming_pool = WatchedPool(
            cfg.max_streaming_calls,
            self.read_watch,
            thread_name_prefix="grpc-stream",
            streaming=True,
            max_calls=STREAMING_QUEUE_FACTOR * cfg.max_streaming_calls,
        )
        self._server = self._build_grpc_server()
        self._admin = None if cfg.admin_port is None else build_admin_server(cfg, self.control, self.metrics)
        self._metrics_http = None
        self._rest = None
        if cfg.http_port is not None:
            limits = cfg.http_limits()
            api = RestApi(
                self.core,
                self.repository,
                self.metrics,
                self.admission,
                device=cfg.device,
                read_timeout_s=limits.read_timeout_s,
                budget=self.budget,
                recommender=self.recommender,
            )
            self._rest = RestServer(
                api,
                cfg.host,
                cfg.http_port,
                max_body_bytes=cfg.max_message_bytes,
                drain_timeout_s=cfg.drain_timeout_s,
                reuse_port=cfg.workers > 1,
                limits=limits,
            )
        self._probe_dir: str | None = None
        self.port = 0
        self.http_port = 0
        self.admin_port = 0

    def _build_grpc_server(self) -> grpc.Server:
        cfg = self.cfg
        options = [
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.so_reuseport", 1 if cfg.workers > 1 else 0),
            # gRPC core drops calls that wait too long for Python to pick them up (early drop between 1,000
            # and 3,000 pending, as CANCELLED, seen by no interceptor): let admission control decide instead.
            ("grpc.server.max_pending_requests", _MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", _MAX_PENDING_CALLS),
            # Handlers get messages as sent, inflated under the budget (recserve.server.transports.reads).
            ("grpc.per_message_decompression", 0),
            # Without BDP probing a stream's receive window stays small until its message is read, so gRPC
            # core does not buffer messages that no pool thread reads yet.
            ("grpc.http2.bdp_probe", 0),
            *connection_options(cfg),
        ]
        # A call holds a pool thread while its request message arrives (grpcio reads it on that thread), so
        # the pool has room for calls still reading beyond the handlers; the read watch ends the slow ones.
        threads = cfg.grpc_threads + READING_THREADS
        server = grpc.server(
            WatchedPool(threads, self.read_watch, thread_name_prefix="grpc"),
            interceptors=[
                StatusInterceptor(
                    self.metrics,
                    admission=self.admission,
                    lag=self.lag,
                    shed_pool=self._shed_pool,
                    streaming_pool=self._streaming_pool,
                    budget=self.budget,
                    max_message_bytes=cfg.max_message_bytes,
                )
            ],
            options=options,
            # Past one RPC per pool thread gRPC itself refuses, on its polling thread (the cheapest refusal
            # there is, so a burst is shed at the rate it arrives); the interceptor counts those too.
            # Streaming calls have a bounded share of their own (their pool refuses past it), so however many
            # are held, the unary pool's threads stay reachable.
            maximum_concurrent_rpcs=threads + self._streaming_pool.max_calls + SHED_CALLS,
        )
        decode_log = DecodeFailureLog()
        add_service(server, pb2, "Predictor", PredictorServicer(self.core, self.recommender), decode_log)
        pipeline = None if self.recommender is None else PipelineModel(self.recommender)
        oip = InferenceServicer(self.core, self.repository, device=cfg.device, pipeline=pipeline)
        add_service(server, oip_pb2, "GRPCInferenceService", oip, decode_log)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = (PREDICTOR_SERVICE, OIP_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
        pool = reflection_pool(pb2, oip_pb2, health_pb2, reflection_pb2)
        reflection.enable_server_reflection(names, server, pool=pool)
        return server

    def start(self) -> int:
        cfg = self.cfg
        self.read_watch.start()
        if isinstance(self.control, SharedControl):
            # A worker that starts late catches up on the model calls the others got before it serves.
            self.control.start()
        credentials = _server_credentials(cfg) if cfg.tls_cert is not None else None
        shared = cfg.workers > 1
        self.port = bind_grpc(self._server, "--port", cfg.host, cfg.port, credentials, reuse_port=shared)
        probe_address = None
        if self.lag is not None:
            probe_address, self._probe_dir = private_socket()
            if self._server.add_insecure_port(probe_address) == 0:
                raise StartupError(f"could not bind the queue-lag probe socket {probe_address}")
        self._start_admin()
        self._server.start()
        if self._rest is not None:
            self.http_port = bind_with("--http-port", cfg.host, cfg.http_port, self._rest.start)
        if probe_address is not None:
            self.lag.start(probe_address)
        if cfg.metrics_port is not None:
            self._metrics_http = bind_with(
                "--metrics-port",
                cfg.metrics_host,
                cfg.metrics_port,
                lambda: start_metrics_http_server(cfg.metrics_port, cfg.metrics_host, self.metrics.registry),
            )
        if self.follower is not None:
            self.follower.start(self.reloader.poll, lambda: self.core.current)
        elif cfg.watch is not None:
            self.reloader.start_watching()
        for name in HEALTH_SERVICES:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        logger.info(
            "serving %s %s on %s:%d (pid %d, %s)",
            self.core.runner.schema.model_name,
            self.core.runner.version,
            cfg.host,
            self.port,
            os.getpid(),
            "TLS" if cfg.tls_cert else "plaintext",
        )
        return self.port

    def _model_health(self, serving: bool) -> None:
        """After an unload or a load that ends it: the model's services report whether it serves (readiness
        probes then take an unloaded model's pod out of rotation); the overall service "" stays SERVING."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in HEALTH_SERVICES[1:]:
            self.health.set(name, status)

    def _start_admin(self) -> None:
        cfg = self.cfg
        if self._admin is None:
            return
        credentials = _server_credentials(cfg) if cfg.tls_cert is not None else None
        self.admin_port = bind_grpc(
            self._admin,
            "--admin-port",
            cfg.admin_host,
            cfg.admin_port,
            credentials,
            reuse_port=cfg.workers > 1,
        )
        self._admin.start()
        auth = "token" if cfg.admin_token else "client certificates" if cfg.tls_client_ca else "loopback only"
        logger.info("admin service on %s:%d (%s)", cfg.admin_host, self.admin_port, auth)

    def stop(self) -> None:
        """Drains: NOT_SERVING, refuse new RPCs, let those in flight finish, then stop batching."""
        self.health.enter_graceful_shutdown()
        if self._admin is not None:
            self._admin.stop(grace=None)
        if self.follower is not None:
            self.follower.stop()  # before the reloader: it swaps in new bases through it
        self.reloader.stop()
        if isinstance(self.control, SharedControl):
            self.control.stop()
        if self.lag is not None:
            self.lag.stop()
        grpc_stopped = self._server.stop(grace=self.cfg.drain_timeout_s)  # both ports drain at once
        if self._rest is not None:
            self._rest.stop()
        grpc_stopped.wait()
        if self._probe_dir is not None:
            shutil.rmtree(self._probe_dir, ignore_errors=True)
        self.read_watch.stop()
        for pool in (self._shed_pool, self._streaming_pool):
            pool.shutdown(wait=False)
        self.core.close()
        if self.recommender is not None:
            self.recommender.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        logger.info("drained and stopped (pid %d)", os.getpid())


def freeze_imports() -> None:
    """Moves every object alive now (what the imports made: torch's, the engine's and gRPC's modules,
    classes and functions, about 350k objects) out of reach of Python's cyclic garbage collector.

    They live as long as the process, yet a full collection traverses each of them: measured in a serving
    worker under issue 43's held-stream attack (calls opened and ended by the hundred a second, whose
    objects are what triggers full collections), one took 1.2 s of wall time on a loaded machine (2.7 s for a
    forced one), every handler and gRPC's polling thread stopped meanwhile, and the queue lag it made shed
    the normal client's calls; after this a full collection takes milliseconds. Called before the model is
    loaded, so that a model replaced by a reload stays collectable.
    """
    gc.collect()  # import-time garbage goes first: nothing frozen is ever collected
    gc.freeze()


def run_server(cfg: ServeConfig) -> int:
    """Runs one server process until SIGTERM or SIGINT, then drains; returns the exit code (0)."""
    freeze_imports()
    threads = cfg.torch_threads or _default_threads(cfg)
    torch.set_num_threads(threads)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = RecServer(cfg)
        try:
            server.start()
        except BaseException:
            server.stop()  # whatever did start (a port, the admin service, batching) stops cleanly
            raise
        while not stop.wait(0.5):
            pass
        logger.info("signal received: draining")
        server.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


def _default_threads(cfg: ServeConfig) -> int:
    """Intra-op threads: the CPUs this process may use, shared by the workers unless each has its own."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    pinned = cfg.workers > 1 and cfg.pin_workers  # the parent clears pin_workers when it did not pin
    return max(1, cpus if pinned else cpus // cfg.workers)


def worker_config(cfg: ServeConfig, index: int, control_dir: Path) -> ServeConfig:
    """The options worker ``index`` of several runs with: the parent serves the aggregated /metrics, and
    model control goes through ``control_dir``, which every worker shares."""
    return replace(cfg, metrics_port=None, worker_index=index, control_dir=control_dir)
