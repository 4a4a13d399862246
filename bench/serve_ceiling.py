"""The most any Python gRPC server can serve of the standard workload on this machine, from measured parts.

Issue 15's objective asks served capacity (closed loop, request batch 64, load generator on the same cores)
to reach 0.6 of the in-process predictor at batch 512. On C cores a server can serve at most

    C / (predict CPU per request + transport CPU per request, server side + client CPU per request)

requests per second, whatever else it does. This script measures each term on this machine:

1. the in-process predictor at batch 512 with every core (the objective's denominator) and its CPU per 64
   examples with one torch thread (``serve_cpu_breakdown.predict_cpu_per_64``);
2. a bare ``grpc.aio`` server that answers the standard 64-example request with 256 bytes and does nothing
   else (no decoding, no model): its CPU per call is what the transport alone costs a server;
3. the client's CPU per call: the project's load generator's way (``grpc.aio``, pre-serialized bytes) and,
   when ``h2load`` (nghttp2, C) is installed, that of a client that costs almost nothing;
4. with ``h2load``, ``recserve serve`` itself: its closed-loop capacity and CPU per request with a nearly free
   client, i.e. how far the server's own work sits above the bare transport.

It prints the ceiling ratio per client; the server's ratio can only be lower.

    .venv/bin/python bench/serve_ceiling.py [--concurrency 32] [--calls 4000] [--duration 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from machine import print_machine
from serve_cpu_breakdown import predict_cpu_per_64, process_tree_cpu_s
from serve_throughput import export_standard, free_port, in_process_examples_per_s, start_server

from recserve.client.loadgen import PREDICT_METHOD, LoadgenConfig, requests_for

_REPLY = b"\x00" * 256
_GRPC_OPTIONS = [("grpc.max_receive_message_length", 1 << 28), ("grpc.max_send_message_length", 1 << 28)]


def _echo_server(port: int, ready) -> None:
    """A grpc.aio server answering PREDICT_METHOD with 256 bytes; nothing else (spawned process)."""
    import grpc

    async def answer(request: bytes, context) -> bytes:
        return _REPLY

    async def main() -> None:
        server = grpc.aio.server(options=_GRPC_OPTIONS)
        service, method = PREDICT_METHOD.strip("/").split("/")
        handler = grpc.unary_unary_rpc_method_handler(answer)  # bytes in, bytes out
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def _aio_calls(target: str, request: bytes, calls: int, concurrency: int) -> None:
    """``calls`` calls from ``concurrency`` callers, each on its own channel, as the load generator makes."""
    import grpc

    options = [*_GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(concurrency)]
    left = calls

    async def caller(channel) -> None:
        nonlocal left
        call = channel.unary_unary(PREDICT_METHOD)
        while left > 0:
            left -= 1
            await call(request)

    await asyncio.gather(*(caller(c) for c in channels))
    await asyncio.gather(*(c.close() for c in channels))


def aio_client_and_server_cpu_ms(target: str, server_pid: int, request: bytes, args) -> tuple[float, float]:
    """(client, server) CPU ms per call of a closed loop of grpc.aio callers in this process."""
    asyncio.run(_aio_calls(target, request, args.calls // 10, args.concurrency))  # connect, warm up
    server0, client0 = process_tree_cpu_s(server_pid), resource.getrusage(resource.RUSAGE_SELF)
    asyncio.run(_aio_calls(target, request, args.calls, args.concurrency))
    server, client1 = process_tree_cpu_s(server_pid) - server0, resource.getrusage(resource.RUSAGE_SELF)
    client = client1.ru_utime + client1.ru_stime - client0.ru_utime - client0.ru_stime
    return client / args.calls * 1e3, server / args.calls * 1e3


def h2load(target: str, request: bytes, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, h2load's CPU ms per request) of an h2load closed loop of gRPC calls to ``target``."""
    with tempfile.NamedTemporaryFile(suffix=".grpc") as body:
        body.write(b"\x00" + struct.pack(">I", len(request)) + request)  # gRPC's message frame
        body.flush()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        threads = str(min(concurrency, os.cpu_count() or 1))
        command = ["h2load", "-t", threads, "-c", str(concurrency), "-m", "1", "-D", f"{seconds:g}"]
        command += ["--warm-up-time", "1", "-d", body.name, "-H", "content-type: application/grpc"]
        command += ["-H", "te: trailers", f"http://{target}{PREDICT_METHOD}"]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", out).group(1))
    rate = float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1))
    failed = int(re.search(r"(\d+) failed", out).group(1))
    if failed:
        raise RuntimeError(f"h2load: {failed} requests failed:\n{out}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return rate, cpu / max(done, 1) * 1e3


def ceiling(cores: int, per_request_ms: float, inproc: float, batch: int = 64) -> tuple[float, float]:
    """(examples/s, ratio to in-process) of a server whose every request costs ``per_request_ms`` CPU."""
    examples = cores / (per_request_ms / 1e3) * batch
    return examples, examples / inproc


def main() -> None:
    print_machine()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--calls", type=int, default=4000, help="calls per grpc.aio measurement")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per h2load measurement")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    has_h2load = shutil.which("h2load") is not None
    with tempfile.TemporaryDirectory(prefix="recserve-bench-") as tmp:
        package = export_standard(Path(tmp) / "pkg")
        torch.set_num_threads(cores)
        inproc = in_process_examples_per_s(package)
        predict = predict_cpu_per_64(package, batches=(8,))[512]
        print(f"in process: {inproc:,.0f} examples/s at batch 512; {predict:.2f} CPU ms per 64 examples")

        ctx = multiprocessing.get_context("spawn")
        ready, port = ctx.Event(), free_port()
        echo = ctx.Process(target=_echo_server, args=(port, ready), daemon=True)
        echo.start()
        ready.wait(60)
        args.max_batch_size, args.max_queue_delay_ms = 512, 2.0
        target = f"127.0.0.1:{free_port()}"
        server = start_server(package, int(target.rsplit(":", 1)[1]), args)
        try:
            request = requests_for(LoadgenConfig(target), count=1)[0]
            echo_target = f"127.0.0.1:{port}"
            client_ms, transport_ms = aio_client_and_server_cpu_ms(echo_target, echo.pid, request, args)
            print(
                f"bare grpc.aio server, {len(request):,}-byte request: {transport_ms:.2f} CPU ms per call; "
                f"grpc.aio client {client_ms:.2f} CPU ms per call"
            )
            clients = {"grpc.aio client": client_ms}
            if has_h2load:
                _, clients["h2load"] = h2load(echo_target, request, args.concurrency, args.duration)
                print(f"h2load client: {clients['h2load']:.2f} CPU ms per call")
            ratios = []
            for name, ms in clients.items():
                examples, ratio = ceiling(cores, predict + transport_ms + ms, inproc)
                ratios.append(ratio)
                print(
                    f"ceiling with the {name}: {cores} cores / "
                    f"({predict:.2f} + {transport_ms:.2f} + {ms:.2f}) ms "
                    f"= {examples:,.0f} examples/s = {ratio:.2f} of in-process"
                )
            if has_h2load:
                served0 = process_tree_cpu_s(server.pid)
                rate, h2_ms = h2load(target, request, args.concurrency, args.duration)
                served_ms = (process_tree_cpu_s(server.pid) - served0) / (rate * (args.duration + 1)) * 1e3
                print(
                    f"recserve serve ({args.workers} workers) with h2load: {64 * rate:,.0f} examples/s "
                    f"= {64 * rate / inproc:.2f} of in-process; server {served_ms:.2f} CPU ms per request "
                    f"(bare transport + predict: {transport_ms + predict:.2f})"
                )
            else:
                print("h2load not found (Debian: apt-get install nghttp2-client): its lines are skipped")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
            echo.kill()
    print(f"serve ceiling ratio {min(ratios):.3f} {max(ratios):.3f}")


if __name__ == "__main__":
    sys.exit(main())
