"""Open-loop load: requests arrive as a Poisson process at a set rate, whether or not earlier ones finished.

A closed loop (:mod:`recserve.client.loadgen`) measures capacity, but its latency is flattered: a slow reply
delays the next request, so a queue never builds up ("coordinated omission"). Here each client process draws
exponential gaps between arrivals (rate / processes each, so their sum is Poisson at ``rate``), sends every
request at its arrival time on the next of a pool of channels, and measures latency from the arrival time it
was *scheduled* for, so time spent waiting on a busy client counts too. Requests are pre-serialized bytes, as
in the closed loop. With ``reply_timings`` each reply is parsed for the timings the server put in it, so the
latency can be split into the batcher's queue, the batch's compute, the rest of the server and what lies
outside it (gRPC both ways and the client).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from recserve.client.loadgen import PREDICT_METHOD, LoadgenConfig, fan_out, requests_for


@dataclass(frozen=True)
class OpenLoopConfig:
    target: str
    rate_rps: float  # mean arrivals per second, all processes together
    duration_s: float = 10.0
    warmup_s: float = 1.0
    request_batch: int = 64
    processes: int | None = None  # None: cores
    channels: int = 16  # per process: connections the arrivals are spread over (and so over --workers)
    timeout_s: float = 5.0
    seed: int = 0
    reply_timings: bool = False  # parse each PredictResponse for its server-side timings
    method: str = PREDICT_METHOD  # the RPC the requests are for (bytes in, bytes out)


@dataclass
class OpenLoopResult:
    rate_rps: float
    seconds: float
    request_batch: int
    latencies_s: np.ndarray  # successful requests, from scheduled arrival to reply
    errors: dict[str, int] = field(default_factory=dict)
    # With ``reply_timings``: per reply, [server, batcher queue, batch compute] seconds (the reply's timings).
    server_timings_s: np.ndarray | None = None

    @property
    def examples_per_s(self) -> float:
        return self.latencies_s.size * self.request_batch / self.seconds

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s.size else float("nan")

    def summary(self) -> str:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        return (
            f"open loop, Poisson {self.rate_rps:,.0f} requests/s x {self.request_batch} examples: "
            f"{self.examples_per_s:,.0f} examples/s served; latency ms p50 {self.percentile_ms(50):.2f} "
            f"p90 {self.percentile_ms(90):.2f} p99 {self.percentile_ms(99):.2f} "
            f"max {self.percentile_ms(100):.2f}; errors: {errors}"
        )

    def latency_split_ms(self, q: float) -> dict[str, float]:
        """The ``q``-th percentile (0-100) of each part of the latency, in ms (needs ``reply_timings``)."""
        if self.server_timings_s is None:
            raise ValueError("latency_split_ms needs a run with OpenLoopConfig(reply_timings=True)")
        server, queue, compute = self.server_timings_s.T
        parts = {
            "batcher queue": queue,
            "batch compute": compute,
            "rest of server": server - queue - compute,
            "outside server": self.latencies_s - server,
        }
        return {
            name: float(np.percentile(x, q) * 1e3) if x.size else float("nan") for name, x in parts.items()
        }

    def split_summary(self) -> str:
        """One line per part of the latency: p50 / p90 / p99 ms (needs ``reply_timings``)."""
        p50, p90, p99 = (self.latency_split_ms(q) for q in (50, 90, 99))
        return "\n".join(
            f"  {part:<15} ms p50 {p50[part]:6.1f} p90 {p90[part]:6.1f} p99 {p99[part]:6.1f}" for part in p50
        )


async def _one(call, payload: bytes, scheduled: float, timeout: float, t_from: float, out, parse) -> None:
    import grpc

    try:
        reply = await call(payload, timeout=timeout)
        code = None
    except grpc.aio.AioRpcError as e:
        code = e.code().name
    if scheduled >= t_from:
        if code is not None:
            out[1][code] += 1
        elif parse is None:
            out[0].append(time.perf_counter() - scheduled)
        else:
            latency, t = time.perf_counter() - scheduled, parse(reply).timings
            out[0].append((latency, t.server_seconds, t.queue_seconds, t.inference_seconds))


async def _arrivals(target, method, requests, rate, channels, t0, t_from, t_to, timeout, seed, reply_timings):
    import grpc

    parse = None
    if reply_timings:
        from recserve.server.transports.protos import pb2

        parse = pb2.PredictResponse.FromString

    options = [
        ("grpc.max_send_message_length", 1 << 28),
        ("grpc.max_receive_message_length", 1 << 28),
        ("grpc.use_local_subchannel_pool", 1),  # one connection per channel, spread over the workers
    ]
    pool = [grpc.aio.insecure_channel(target, options=options) for _ in range(channels)]
    calls = [ch.unary_unary(method) for ch in pool]
    rng = random.Random(seed)
    out: tuple[list[float], Counter] = ([], Counter())
    tasks = set()
    scheduled, i = t0, 0
    try:
        while True:
            scheduled += rng.expovariate(rate)
            if scheduled >= t_to:
                break
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(
                _one(calls[i % channels], requests[i % len(requests)], scheduled, timeout, t_from, out, parse)
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        await asyncio.gather(*(ch.close() for ch in pool))
    return out


def _process_main(cfg: OpenLoopConfig, requests, rate, seed, ready, go, results) -> None:
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    t_from, t_to = t0 + cfg.warmup_s, t0 + cfg.warmup_s + cfg.duration_s
    lat, errors = asyncio.run(
        _arrivals(
            cfg.target,
            cfg.method,
            requests,
            rate,
            cfg.channels,
            t0,
            t_from,
            t_to,
            cfg.timeout_s,
            seed,
            cfg.reply_timings,
        )
    )
    results.put((lat, dict(errors)))


def run_open_loop(cfg: OpenLoopConfig, requests: list[bytes] | None = None) -> OpenLoopResult:
    """Poisson arrivals at ``cfg.rate_rps`` for ``cfg.duration_s`` (after ``cfg.warmup_s``)."""
    if requests is None:
        requests = requests_for(LoadgenConfig(cfg.target, request_batch=cfg.request_batch, seed=cfg.seed))
    nproc = cfg.processes or os.cpu_count() or 1
    process_args = [(cfg, requests, cfg.rate_rps / nproc, cfg.seed * 1000 + p) for p in range(nproc)]
    wait_s = cfg.warmup_s + cfg.duration_s + cfg.timeout_s + 120
    latencies, errors = fan_out(_process_main, process_args, wait_s)
    timings = None
    if cfg.reply_timings:  # rows of [latency, server, queue, compute]
        rows = latencies.reshape(-1, 4)
        latencies, timings = rows[:, 0], rows[:, 1:]
    return OpenLoopResult(cfg.rate_rps, cfg.duration_s, cfg.request_batch, latencies, errors, timings)
