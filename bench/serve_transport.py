"""Would a ``grpc.aio`` data plane meet issue 15's objective? ``recserve serve`` vs two minimal aio servers.

``recserve serve`` answers every RPC on a handler thread of a synchronous gRPC server: the polling thread
wakes a handler per request and the batch thread wakes each request's handler when its batch is done. The
alternatives measured here answer ``Predict`` as a coroutine on each worker's event loop (``grpc.aio``), with
the same :class:`InferenceCore` / :class:`ModelRunner`, batcher settings, decoding, validation and reply
(``predict_response``), and their workers pinned as ``recserve serve`` pins its own (``cpu_groups``):

- ``grpc.aio``: the coroutine queues on the runner's batcher thread and awaits its future
  (``asyncio.wrap_future``), so a worker has two busy threads, the loop and the batch thread;
- ``grpc.aio, batches on the loop``: the loop forms the batches itself (a batch closes at
  ``--max-batch-size`` examples or when its oldest request has waited ``--max-queue-delay-ms``, as the
  batcher's) and computes them inline, so a worker has one busy Python thread and requests that arrive
  during a batch wait in gRPC core, not in a thread competing with the batch for the CPU.

Neither has the server's admission control, status mapping, metrics, deadlines or queue-lag probes, so
they bound what a change of transport alone can give; they are not servers to run.

Rounds alternate the three (a noisy neighbour then hits all), each: closed-loop capacity with the server's
CPU ms per request (its processes, from /proc), then open-loop Poisson arrivals at ``--load`` of that
capacity, their latency split by each reply's own timings into the batcher's queue, the batch's compute, the
rest of the server and what lies outside it (gRPC both ways and the client).

    .venv/bin/python bench/serve_transport.py [--rounds 3] [--workers 2] [--duration 8] [--load 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import print_machine
from serve_cpu_breakdown import process_tree_cpu_s
from serve_throughput import (
    export_standard,
    free_port,
    in_process_examples_per_s,
    start_server,
    wait_serving,
)

from recserve.client.loadgen import LoadgenConfig, requests_for, run_loadgen
from recserve.client.openloop import OpenLoopConfig, run_open_loop
from recserve.server.batcher import Completed
from recserve.server.workers import cpu_groups


class _LoopBatches:
    """Batches formed and computed on the event loop (the ``batches on the loop`` variant)."""

    def __init__(self, runner, max_batch_size: int, max_queue_delay_s: float) -> None:
        self._runner = runner
        self._max = max_batch_size
        self._delay = max_queue_delay_s
        self._pending: collections.deque = collections.deque()  # (request, future, arrival)
        self._examples = 0
        self._timer: asyncio.Handle | None = None

    def submit(self, request) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future, time.monotonic()))
        self._examples += request.batch_size
        if self._examples >= self._max and self._timer is not None:
            self._timer.cancel()  # full: run it now rather than at the oldest request's deadline
            self._timer = None
        self._schedule()
        return future

    def _schedule(self) -> None:
        if not self._pending or self._timer is not None:
            return
        loop = asyncio.get_running_loop()
        if self._examples >= self._max:
            self._timer = loop.call_soon(self._run_batch)
        else:
            wait = self._pending[0][2] + self._delay - time.monotonic()
            self._timer = loop.call_at(loop.time() + max(0.0, wait), self._run_batch)

    def _run_batch(self) -> None:
        self._timer = None
        batch, examples = [], 0
        while self._pending and (not batch or examples + self._pending[0][0].batch_size <= self._max):
            batch.append(self._pending.popleft())
            examples += batch[-1][0].batch_size
        self._examples -= examples
        start = time.monotonic()
        try:
            scores = self._runner._predict_batch([request for request, _, _ in batch])
        except Exception as exc:
            for _, future, _ in batch:
                future.set_exception(exc)
        else:
            seconds = time.monotonic() - start
            for (_, future, arrival), result in zip(batch, scores):
                future.set_result(Completed(result, start - arrival, seconds, examples))
        self._schedule()


def _aio_worker(
    package: str, port: int, max_batch_size: int, max_queue_delay_ms: float, on_loop: bool, cpus: list[int]
) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    from recserve.server.app import load_runner
    from recserve.server.batcher import BatcherConfig
    from recserve.server.codec import decode_predict_request
    from recserve.server.core import InferenceCore, InferenceResult
    from recserve.server.metrics import ServerMetrics
    from recserve.server.protos import PREDICTOR_SERVICE, pb2
    from recserve.server.servicer import PredictorServicer, predict_response
    from recserve.server.validation import check_request

    os.sched_setaffinity(0, cpus)  # as `recserve serve` pins its workers, so both are compared pinned
    torch.set_num_threads(len(cpus))  # as `recserve serve` sets it: one thread per CPU of the worker
    batching = BatcherConfig(max_batch_size, max_queue_delay_ms / 1000.0)
    core = InferenceCore(load_runner(Path(package), batching, ServerMetrics()))
    metadata = PredictorServicer(core).ModelMetadata
    runner = core.runner
    loop_batches = _LoopBatches(runner, max_batch_size, batching.max_queue_delay_s) if on_loop else None

    async def predict(request, context):
        received = time.monotonic()
        arrays = decode_predict_request(request)
        if loop_batches is not None:
            done = await loop_batches.submit(check_request(arrays, runner.schema))
            result = InferenceResult(
                done.result, *runner.model_id, done.queue_seconds, done.inference_seconds, done.batch_size
            )
            return predict_response(request, result, received)
        ticket = core.submit(arrays, model_name=request.model_name, received=received)
        with contextlib.suppress(Exception):  # complete() re-raises it
            await asyncio.wrap_future(ticket.future)
        return predict_response(request, core.complete(ticket), received)

    async def model_metadata(request, context):
        return metadata(request, context)

    def handler(behavior, request_type, response_type):
        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )

    async def serve() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
        methods = {
            "Predict": handler(predict, pb2.PredictRequest, pb2.PredictResponse),
            "ModelMetadata": handler(model_metadata, pb2.ModelMetadataRequest, pb2.ModelMetadataResponse),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PREDICTOR_SERVICE, methods),))
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        await server.wait_for_termination()

    asyncio.run(serve())


def _aio_main(
    package: str, port: int, workers: int, max_batch_size: int, max_queue_delay_ms: float, on_loop: bool
) -> None:
    ctx = multiprocessing.get_context("spawn")
    groups = cpu_groups(sorted(os.sched_getaffinity(0)), workers)
    if groups is None:
        raise SystemExit(f"--workers {workers}: more workers than CPUs")
    settings = (package, port, max_batch_size, max_queue_delay_ms, on_loop)
    procs = [ctx.Process(target=_aio_worker, args=(*settings, cpus)) for cpus in groups]
    for p in procs:
        p.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.sigwait({signal.SIGTERM})
    for p in procs:
        p.terminate()
    for p in procs:
        p.join()


def start_aio_server(
    package: Path, port: int, args: argparse.Namespace, *, on_loop: bool = False
) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--aio-server", str(package), str(port), str(args.workers)]
    cmd += [str(args.max_batch_size), str(args.max_queue_delay_ms), "loop" if on_loop else "thread"]
    proc = wait_serving(subprocess.Popen(cmd, env=dict(os.environ, PYTHONWARNINGS="ignore")), port)
    time.sleep(2.0 * args.workers)  # every worker listening, not just the first to report SERVING
    return proc


def measure(proc: subprocess.Popen, target: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """(capacity examples/s, server CPU ms per request at capacity, p99 ms at ``args.load``)."""
    cfg = LoadgenConfig(target, args.concurrency, args.duration, 64, warmup_s=1.0)
    requests = requests_for(cfg)
    cpu0 = process_tree_cpu_s(proc.pid)
    capacity = run_loadgen(cfg, requests)
    cpu_ms = (process_tree_cpu_s(proc.pid) - cpu0) / max(1, capacity.latencies_s.size) * 1e3
    rate = args.load * capacity.requests / capacity.seconds
    open_loop = run_open_loop(
        OpenLoopConfig(target, rate, args.duration, warmup_s=1.0, reply_timings=True), requests
    )
    print(f"  closed loop: {capacity.summary()}; server CPU {cpu_ms:.2f} ms per request")
    print(f"  {args.load:.0%} of capacity: {open_loop.summary()}", flush=True)
    print(open_loop.split_summary())
    return capacity.examples_per_s, cpu_ms, open_loop.percentile_ms(99)


def main() -> None:
    print_machine()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--max-batch-size", type=int, default=512)
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    args = ap.parse_args()
    starts = {
        "sync (recserve serve)": start_server,
        "grpc.aio": start_aio_server,
        "grpc.aio, batches on the loop": functools.partial(start_aio_server, on_loop=True),
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in starts}
    with tempfile.TemporaryDirectory(prefix="recserve-bench-") as tmp:
        package = export_standard(Path(tmp) / "pkg")
        torch.set_num_threads(os.cpu_count() or 1)
        inproc = in_process_examples_per_s(package)
        print(f"in-process int8 predict at batch 512: {inproc:,.0f} examples/s")
        for r in range(args.rounds):
            for name, start in starts.items():
                port = free_port()
                proc = start(package, port, args)
                print(f"round {r + 1}, {name}:", flush=True)
                try:
                    results[name].append(measure(proc, f"127.0.0.1:{port}", args))
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
    for name, runs in results.items():
        caps, cpus, p99s = zip(*runs)
        print(
            f"{name}: capacity/in-process {min(caps) / inproc:.2f}-{max(caps) / inproc:.2f}, "
            f"server CPU {min(cpus):.2f}-{max(cpus):.2f} ms per request, "
            f"p99 at {args.load:.0%} {min(p99s):.0f}-{max(p99s):.0f} ms ({len(runs)} runs)"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--aio-server"]:
        package, port, workers, batch, delay, where = sys.argv[2:8]
        _aio_main(package, int(port), int(workers), int(batch), float(delay), where == "loop")
    else:
        main()
