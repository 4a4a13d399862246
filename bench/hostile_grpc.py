"""Issue 43's gRPC attacks at full size against the default server, with a normal client measuring the effect.

Exports the standard DLRM, starts ``recserve serve`` with its defaults (workers, pinning, limits) plus a REST
port, and runs, one after the other:

1. **held streams**: 40 connections carrying 200 Predict streams that send the 5-byte message prefix and then
   a byte every 2 s (never END_STREAM, no ``grpc-timeout``), plus 40 connections carrying 200 reflection
   streams that never send, for ``--hold`` seconds (60), while a normal client calls Predict, health Check and
   REST ready in a loop, each with a 5 s deadline; the attack opens a stream again whenever the server ends
   one;
2. **gzip messages**: 24 threads at once sending a 61 KB gzip message that inflates to 60 MB;
3. **max-size requests**: 64 clients looping valid requests of ~63 MiB for ``--flood`` seconds (15).

It prints the normal client's answered and failed calls, what the attack saw, and each worker's resident and
peak resident memory (VmRSS, VmHWM) before and after each phase beside the worker's request budget.

    .venv/bin/python bench/hostile_grpc.py [--hold 60] [--flood 15] [--clients 64] [--phases held,gzip,flood]
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serving"))
from hostile import HeldStreams, vm_kib  # noqa: E402
from machine import print_machine  # noqa: E402
from serve_throughput import export_standard, free_port, wait_serving  # noqa: E402

from recserve.client import PredictorClient  # noqa: E402
from recserve.client.loadgen import build_requests  # noqa: E402

PREDICT = "/recserve.v1.Predictor/Predict"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def workers_of(server: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out] or [server.pid]


def memory(pids: list[int]) -> str:
    return ", ".join(f"{vm_kib(p, 'VmRSS') / 1024:.0f}/{vm_kib(p, 'VmHWM') / 1024:.0f} MiB" for p in pids)


def requests(port: int, batch: int, count: int) -> list[bytes]:
    with PredictorClient(f"127.0.0.1:{port}") as client:
        model = client.metadata()
    return build_requests(model, batch, count, 20, 0)


def normal_client(port: int, http_port: int, request: bytes, stop: threading.Event, tally: dict) -> None:
    client = PredictorClient(f"127.0.0.1:{port}")
    predict = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(PREDICT)
    ready = f"http://127.0.0.1:{http_port}/v2/health/ready"
    calls = {
        "predict": lambda: predict(request, timeout=5),
        "health": lambda: client.health(timeout=5),
        "rest ready": lambda: urllib.request.urlopen(ready, timeout=5),
    }
    while not stop.is_set():
        for name, call in calls.items():
            try:
                call()
                tally["answered"] += 1
            except Exception as exc:  # gRPC or HTTP: the normal client's failure, whatever it is
                code = exc.code().name if isinstance(exc, grpc.RpcError) else type(exc).__name__
                key = f"{name}: {code}"
                tally["failed"][key] = tally["failed"].get(key, 0) + 1
        time.sleep(0.05)


def held_streams(port: int, http_port: int, seconds: float) -> None:
    tally = {"answered": 0, "failed": {}}
    stop = threading.Event()
    request = requests(port, 16, 1)[0]
    with (
        HeldStreams(port, PREDICT, connections=40, streams=5) as predict,
        HeldStreams(port, REFLECTION, connections=40, streams=5, send_prefix=False) as reflection,
    ):
        time.sleep(1.0)
        client = threading.Thread(target=normal_client, args=(port, http_port, request, stop, tally))
        client.start()
        time.sleep(seconds)
        stop.set()
        client.join()
    print(
        f"held streams, {seconds:.0f} s: normal client answered {tally['answered']}, failed {tally['failed']}"
    )
    for name, attack in (("predict", predict), ("reflection", reflection)):
        s = attack.stats
        print(
            f"  {name} attack: {s.streams_opened} streams opened, {s.streams_reset} ended by the server, "
            f"grpc-status {s.statuses}"
        )


def senders(port: int, payload: bytes, threads: int, until: float | None = None) -> dict[str, int]:
    """``threads`` clients, each on its own channel, sending ``payload`` to Predict once (or in a loop until
    the monotonic time ``until``); the status codes they got, counted."""
    codes: dict[str, int] = {}
    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    def send() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as channel:
            call = channel.unary_unary(PREDICT)  # bytes as they are
            while True:
                try:
                    call(payload, timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                codes[code] = codes.get(code, 0) + 1
                if until is None or time.monotonic() >= until:
                    return

    clients = [threading.Thread(target=send) for _ in range(threads)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    return codes


def gzip_messages(port: int) -> None:
    bomb = gzip.compress(b"\0" * (60 << 20))
    codes = senders(port, bomb, 24)
    print(f"24 gzip messages of {len(bomb) / 1e3:.0f} KB inflating to 60 MiB: {codes}")


def max_size_flood(port: int, seconds: float, clients: int) -> None:
    small = requests(port, 64, 1)[0]
    request = requests(port, 64 * (62 << 20) // len(small), 1)[0]  # just under the 64 MiB limit
    codes = senders(port, request, clients, until=time.monotonic() + seconds)
    print(f"{clients} clients looping {len(request) / 2**20:.0f} MiB requests for {seconds:.0f} s: {codes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold", type=float, default=60.0, help="seconds of held streams")
    ap.add_argument("--flood", type=float, default=15.0, help="seconds of max-size requests")
    ap.add_argument("--clients", type=int, default=64, help="clients looping max-size requests")
    ap.add_argument("--phases", default="held,gzip,flood", help="which attacks to run, in this order")
    args = ap.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory(prefix="recserve-hostile-") as tmp:
        package = export_standard(Path(tmp) / "pkg")
        port, http_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "recserve.cli", "serve", "--package", str(package), "--port", str(port)]
        cmd += ["--http-port", str(http_port), "--metrics-port", "-1", "--admin-port", "-1"]
        server = wait_serving(subprocess.Popen(cmd), port, timeout_s=600)
        try:
            pids = workers_of(server)
            print(f"workers {pids}: resident/peak {memory(pids)} at start")
            phases = {
                "held": lambda: held_streams(port, http_port, args.hold),
                "gzip": lambda: gzip_messages(port),
                "flood": lambda: max_size_flood(port, args.flood, args.clients),
            }
            for name in args.phases.split(","):
                phases[name]()
                print(f"  resident/peak after: {memory(pids)}")
        finally:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
