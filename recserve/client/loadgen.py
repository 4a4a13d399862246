"""Load generator: closed-loop clients in their own processes, throughput and latency percentiles.

Each process runs ``concurrency / processes`` asyncio callers, each on its own channel and connection (as
independent clients are); every caller sends a request, waits for the reply, and sends the next (closed
loop). Requests are built once from the server's ``ModelMetadata`` (random ids inside each table,
standard-normal dense features) and sent as pre-serialized bytes, so the client spends its CPU on gRPC, not
on protobuf. Latency is measured per request from send to reply; the first ``warmup_s`` seconds are not
counted. A sweep repeats the run per concurrency level.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from recserve.client.client import ServedModel

# torch, the client and the codec are imported where requests are built, not at module level: each caller
# process imports this module, and what it imports is CPU it spends beside the server it measures.

PREDICT_METHOD = "/recserve.v1.Predictor/Predict"


@dataclass(frozen=True)
class LoadgenConfig:
    target: str
    concurrency: int = 32
    duration_s: float = 10.0
    request_batch: int = 64
    processes: int | None = None  # None: min(concurrency, cores)
    warmup_s: float = 1.0
    timeout_s: float = 5.0
    ids_per_feature: int = 20  # mean ids per example and feature (uniform 1 .. 2 * mean - 1)
    seed: int = 0
    method: str = PREDICT_METHOD  # the RPC the requests are for (bytes in, bytes out)


@dataclass
class LoadgenResult:
    concurrency: int
    seconds: float
    request_batch: int
    latencies_s: np.ndarray  # successful requests only
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return int(self.latencies_s.size)

    @property
    def examples_per_s(self) -> float:
        return self.requests * self.request_batch / self.seconds

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.requests else float("nan")

    def summary(self) -> str:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        return (
            f"concurrency {self.concurrency}, request batch {self.request_batch}: "
            f"{self.examples_per_s:,.0f} examples/s ({self.requests / self.seconds:,.0f} requests/s); "
            f"latency ms p50 {self.percentile_ms(50):.2f} p90 {self.percentile_ms(90):.2f} "
            f"p95 {self.percentile_ms(95):.2f} p99 {self.percentile_ms(99):.2f} "
            f"max {self.percentile_ms(100):.2f}; errors: {errors}"
        )


def build_requests(
    model: ServedModel, batch: int, count: int, ids_per_feature: int, seed: int
) -> list[bytes]:
    """``count`` serialized PredictRequests of ``batch`` examples fitting ``model``'s schema."""
    import torch

    from recserve.client.oip_requests import random_batch
    from recserve.server.transports.codec import encode_predict_request

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        dense, kjt = random_batch(model, batch, ids_per_feature, g)
        out.append(encode_predict_request(dense, kjt, request_id=f"loadgen-{i}").SerializeToString())
    return out


async def _caller(call, requests: list[bytes], offset: int, t_from: float, t_to: float, timeout: float, out):
    import grpc

    i = offset
    while True:
        start = time.perf_counter()
        if start >= t_to:
            return
        try:
            await call(requests[i % len(requests)], timeout=timeout)
            code = None
        except grpc.aio.AioRpcError as e:
            code = e.code().name
        end = time.perf_counter()
        if start >= t_from:
            if code is None:
                out[0].append(end - start)
            else:
                out[1][code] += 1
        i += 1


async def _run_process(target, method, requests, callers, t_from, t_to, timeout, offset):
    import grpc

    options = [
        ("grpc.max_send_message_length", 1 << 28),
        ("grpc.max_receive_message_length", 1 << 28),
        # Each caller is an independent client with its own TCP connection (gRPC would otherwise share one
        # per process), so several SO_REUSEPORT workers see the load spread over them as in production.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    out: tuple[list[float], Counter] = ([], Counter())
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(callers)]
    try:
        await asyncio.gather(
            *(
                # bytes in, bytes out: no (de)serialization cost
                _caller(channel.unary_unary(method), requests, offset + 7 * c, t_from, t_to, timeout, out)
                for c, channel in enumerate(channels)
            )
        )
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    return out


def _process_main(
    target, method, requests, callers, warmup_s, duration_s, timeout, offset, ready, go, results
) -> None:
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    lat, errors = asyncio.run(
        _run_process(
            target, method, requests, callers, t0 + warmup_s, t0 + warmup_s + duration_s, timeout, offset
        )
    )
    results.put((lat, dict(errors)))


def requests_for(cfg: LoadgenConfig, count: int = 16) -> list[bytes]:
    """``count`` serialized requests fitting the schema the server at ``cfg.target`` reports."""
    from recserve.client.client import PredictorClient

    with PredictorClient(cfg.target) as client:
        client.wait_ready(30)
        model = client.metadata()
    return build_requests(model, cfg.request_batch, count, cfg.ids_per_feature, cfg.seed)


def fan_out(
    target, process_args: list[tuple], wait_s: float, on_go: Callable[[float], None] | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Runs ``target(*args, ready, go, results)`` in one spawned process per ``args``; all start together.

    Each process sets ``ready`` once connected, waits for ``go``, and puts ``(latencies, errors)`` on
    ``results``; the latencies and error counts of all of them are returned together. ``on_go(t0)`` is
    called with the ``time.perf_counter()`` instant of the start (the clock every process shares on Linux),
    so a caller can measure exactly the processes' window (a bench reading CPU time).
    """
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs, readies = [], []
    for args in process_args:
        ready = ctx.Event()
        procs.append(ctx.Process(target=target, args=(*args, ready, go, results), daemon=True))
        readies.append(ready)
        procs[-1].start()
    for ready in readies:
        ready.wait(120)
    # The start instant is handed over before the callers go, so a caller never reads it unset.
    if on_go is not None:
        on_go(time.perf_counter())
    go.set()
    latencies: list[float] = []
    errors: Counter = Counter()
    for _ in procs:
        lat, err = results.get(timeout=wait_s)
        latencies += lat
        errors.update(err)
    for p in procs:
        p.join()
    return np.asarray(latencies), dict(errors)


def run_loadgen(
    cfg: LoadgenConfig,
    requests: list[bytes] | None = None,
    on_go: Callable[[float], None] | None = None,
) -> LoadgenResult:
    """Runs one closed-loop load test against ``cfg.target``; ``on_go`` as :func:`fan_out` calls it (the
    measured window is ``cfg.warmup_s`` to ``cfg.warmup_s + cfg.duration_s`` after its argument)."""
    if requests is None:
        requests = requests_for(cfg)
    nproc = cfg.processes or min(cfg.concurrency, os.cpu_count() or 1)
    shares = [cfg.concurrency // nproc + (1 if i < cfg.concurrency % nproc else 0) for i in range(nproc)]
    process_args = [
        (cfg.target, cfg.method, requests, callers, cfg.warmup_s, cfg.duration_s, cfg.timeout_s, 3 * i)
        for i, callers in enumerate(s for s in shares if s)
    ]
    wait_s = cfg.warmup_s + cfg.duration_s + cfg.timeout_s + 120
    latencies, errors = fan_out(_process_main, process_args, wait_s, on_go)
    return LoadgenResult(cfg.concurrency, cfg.duration_s, cfg.request_batch, latencies, errors)


def sweep(cfg: LoadgenConfig, levels: list[int]) -> list[LoadgenResult]:
    """One run per concurrency level (same requests for all)."""
    from dataclasses import replace

    requests = requests_for(cfg)
    return [run_loadgen(replace(cfg, concurrency=c), requests) for c in levels]


def format_table(results: list[LoadgenResult]) -> str:
    """A throughput-vs-latency table, one row per run."""
    rows = ["concurrency  examples/s  requests/s  p50 ms  p90 ms  p99 ms  max ms  errors"]
    for r in results:
        errs = sum(r.errors.values())
        rows.append(
            f"{r.concurrency:>11}  {r.examples_per_s:>10,.0f}  {r.requests / r.seconds:>10,.0f}  "
            f"{r.percentile_ms(50):>6.2f}  {r.percentile_ms(90):>6.2f}  {r.percentile_ms(99):>6.2f}  "
            f"{r.percentile_ms(100):>6.2f}  {errs:>6}"
        )
    return "\n".join(rows)
