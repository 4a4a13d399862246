"""Issue 43's hostile clients at full size against the default server, a normal client beside them.

Exports the standard DLRM (the serving benches' package), starts ``recserve serve`` with its defaults
(2 workers, limits, pinning) plus a REST port, measures the server's CPU at rest and the normal client alone
(``--alone`` s), then runs each attack:

- ``held``: 200 Predict streams over 40 raw HTTP/2 connections (HEADERS without ``grpc-timeout``, the 5-byte
  prefix, then a byte every 2 s, never END_STREAM; a stream the server ends is opened again) plus 200
  ``ServerReflectionInfo`` streams from the stock gRPC client that never send, for ``--hold`` s (60);
- ``rest_gzip``: 40 REST uploads, each a 61 KB gzip body inflating to 60 MB with a ``Content-Length`` 1,000
  bytes longer than sent, stalled until the server answers (408 at ``--http-read-timeout``, 30 s);
- ``grpc_gzip``: 24 gRPC messages at once, each 61 KB of gzip inflating to 60 MB;
- ``flood``: 64 clients looping valid requests (512 examples) just under ``--max-message-mb``, ``--flood`` s;
- ``idle``: 2,200 TCP connections to the REST port kept open for ``--idle-hold`` s (those the server closes
  are opened again in waves, every 5 s).

Throughout each attack a normal client calls gRPC Predict, health Check and REST infer in a loop (5 s
deadlines) and counts its errors. For each worker the bench prints its resident memory growth (VmRSS, at the
attack's end) and peak growth (VmHWM, reset before the attack) over its memory at the attack's start, beside
the request memory budget, the documented bound (docs/serving-limits.md) and the 1 GiB cap. One figure per
line, value last.

    python -m bench hostile [--hold 60] [--flood 15] [--idle-hold 30] [--phases rest,held,rest_gzip,...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from machine import print_machine  # noqa: E402
from serve_throughput import export_standard, free_port, wait_serving  # noqa: E402

from recserve.client import PredictorClient  # noqa: E402
from recserve.client.loadgen import build_requests  # noqa: E402
from recserve.client.oip_requests import random_batch  # noqa: E402
from recserve.server.transports.budget import default_request_budget  # noqa: E402
from recserve.server.transports.reads import GROWTH_CONSTANT, READ_MEMORY_SLACK  # noqa: E402
from tests.serving.hostile import vm_kib  # noqa: E402

PREDICT = "/recserve.v1.Predictor/Predict"
MIB = 1 << 20
MAX_MESSAGE = 64 * MIB  # --max-message-mb's default
WORKERS = 2
CAP_MIB = 1024
WAVE_SECONDS = 5.0  # idle connections the server closed are opened again this often, in one wave
# Each client its own connection (gRPC Python shares one per target otherwise), spread over the workers.
BIG = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),
]


# -- the server's processes ----------------------------------------------------------------------------------


def workers_of(server: subprocess.Popen) -> list[int]:
    """The server's worker processes (its children other than multiprocessing's helpers)."""
    out = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in map(int, out):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"resource_tracker" not in cmdline and b"forkserver" not in cmdline:
            pids.append(pid)
    return pids or [server.pid]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its threads so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak(pid: int) -> None:
    """VmHWM := VmRSS (Linux clear_refs 5), so each attack's peak is its own."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


class WorkerMemory:
    """Each worker's VmRSS at the start of an attack; growth of VmRSS and VmHWM over it at the end."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        for pid in pids:
            reset_peak(pid)
        self.start = {pid: vm_kib(pid, "VmRSS") / 1024 for pid in pids}

    def report(self, name: str) -> None:
        for i, pid in enumerate(self.pids):
            rss, hwm = vm_kib(pid, "VmRSS") / 1024, vm_kib(pid, "VmHWM") / 1024
            print(f"{name} worker {i} VmRSS growth MiB {rss - self.start[pid]:.0f}")
            print(f"{name} worker {i} VmHWM growth MiB {hwm - self.start[pid]:.0f}")


# -- the normal client ---------------------------------------------------------------------------------------


class NormalClient:
    """gRPC Predict, health Check and REST infer in a loop, 5 s deadlines, while the attack runs."""

    def __init__(self, port: int, http_port: int, model) -> None:
        g = torch.Generator().manual_seed(1)
        request = build_requests(model, 16, 1, 20, 1)[0]
        dense, kjt = random_batch(model, 4, 20, g)
        inputs = [{"name": "dense", "datatype": "FP32", "shape": list(dense.shape), "data": dense.tolist()}]
        for k in model.feature_names:
            jt = kjt[k]
            lengths, values = jt.lengths().tolist(), jt.values().tolist()
            inputs.append(
                {"name": f"{k}.lengths", "datatype": "INT32", "shape": [len(lengths)], "data": lengths}
            )
            inputs.append(
                {"name": f"{k}.values", "datatype": "INT64", "shape": [len(values)], "data": values}
            )
        body = json.dumps({"inputs": inputs}).encode()
        url = f"http://127.0.0.1:{http_port}/v2/models/{model.model_name}/infer"
        self._channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        predict = self._channel.unary_unary(PREDICT)
        health = PredictorClient(f"127.0.0.1:{port}")

        def rest() -> None:
            post = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(post, timeout=5) as r:
                r.read()

        self._calls = {
            "grpc predict": lambda: predict(request, timeout=5),
            "health check": lambda: health.health(timeout=5),
            "rest infer": rest,
        }
        self.answered = 0
        self.failed: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, call in self._calls.items():
                try:
                    call()
                    self.answered += 1
                except Exception as exc:  # gRPC or HTTP: the normal client's failure, whatever it is
                    if isinstance(exc, grpc.RpcError):
                        code = exc.code().name
                    elif isinstance(exc, urllib.error.HTTPError):
                        code = str(exc.code)
                    else:
                        code = type(exc).__name__
                    key = f"{name} {code}"
                    self.failed[key] = self.failed.get(key, 0) + 1
            time.sleep(0.05)

    def __enter__(self) -> NormalClient:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self._channel.close()

    def report(self, name: str) -> None:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(self.failed.items())) or "none"
        print(f"  {name}: normal client failures: {detail}")
        print(f"{name} normal client calls answered {self.answered}")
        print(f"{name} normal client errors {sum(self.failed.values())}")


# -- the attacks ---------------------------------------------------------------------------------------------


def held_streams(port: int, normal: NormalClient, seconds: float) -> None:
    """The attack runs in a process of its own (``tests/serving/hostile.py``), as another client would, so
    that its 80 connections and 400 streams do not take this process's CPU from the normal client."""
    attack = subprocess.Popen(
        [sys.executable, "-m", "tests.serving.hostile", "held", str(port), str(seconds + 2.0)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # the streams opened
    with normal:
        time.sleep(seconds)
    out, _ = attack.communicate(timeout=120)
    normal.report("held streams")
    stats = json.loads(out.strip().splitlines()[-1])
    p, r = stats["predict"], stats["reflection"]
    print(
        f"  held Predict streams: {p['streams_opened']} opened, {p['streams_reset']} ended by the server, "
        f"grpc-status {p['statuses']}"
    )
    print(f"  silent reflection streams: {r['opened']} opened, ended by the server {r['ended']}")


def stalled_gzip_uploads(http_port: int, model_name: str, normal: NormalClient, pids: list[int]) -> None:
    bomb = gzip.compress(b'{"inputs": [' + b" " * (60_000_000 - 12), 9)
    head = (
        f"POST /v2/models/{model_name}/infer HTTP/1.1\r\nHost: localhost\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(bomb) + 1000}\r\n\r\n"
    ).encode()
    memory = WorkerMemory(pids)
    socks = [socket.create_connection(("127.0.0.1", http_port), timeout=60) for _ in range(40)]
    answers: dict[str, int] = {}
    started = time.monotonic()
    with normal:
        for sock in socks:
            sock.sendall(head + bomb)
        for sock in socks:  # each waits for the server's answer (408 at --http-read-timeout)
            try:
                status = sock.recv(64).split(b"\r\n", 1)[0].decode(errors="replace")[9:12] or "closed"
            except OSError as exc:
                status = type(exc).__name__
            answers[status] = answers.get(status, 0) + 1
    waited = time.monotonic() - started
    memory.report("stalled gzip uploads")
    for sock in socks:
        sock.close()
    normal.report("stalled gzip uploads")
    print(
        f"  40 stalled uploads of {len(bomb) / 1e3:.0f} KB (inflating to 60 MB): "
        f"answered {answers} within {waited:.0f} s"
    )


def senders(port: int, payload: bytes, threads: int, until: float | None = None) -> dict[str, int]:
    """``threads`` clients, each on its own channel, sending ``payload`` to Predict once (or in a loop until
    the monotonic time ``until``); the status codes they got, counted."""
    codes: dict[str, int] = {}
    lock = threading.Lock()

    def send() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=BIG) as channel:
            call = channel.unary_unary(PREDICT)  # bytes as they are
            while True:
                try:
                    call(payload, timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1
                if until is None or time.monotonic() >= until:
                    return

    clients = [threading.Thread(target=send) for _ in range(threads)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    return codes


def gzip_messages(port: int, normal: NormalClient, pids: list[int]) -> None:
    bomb = gzip.compress(b"\0" * 60_000_000, 9)
    memory = WorkerMemory(pids)
    with normal:
        codes = senders(port, bomb, 24)
        time.sleep(1.0)
    memory.report("gzip grpc messages")
    normal.report("gzip grpc messages")
    print(f"  24 gzip messages of {len(bomb) / 1e3:.0f} KB inflating to 60 MB: {codes}")


def max_size_request(model) -> bytes:
    """A valid request of the model's largest batch, with as many ids per feature as fit under the message
    limit (less 2 MiB)."""
    batch = model.max_batch_size
    probe = build_requests(model, batch, 1, 20, 2)[0]
    per_id = 8 * batch * len(model.features) * 20  # int64 ids, lengths drawn with mean ids_per_feature
    ids = max(1, int(20 * (MAX_MESSAGE - 2 * MIB - (len(probe) - per_id)) / per_id))
    return build_requests(model, batch, 1, ids, 2)[0]


def max_size_flood(
    port: int, model, normal: NormalClient, pids: list[int], seconds: float, clients: int
) -> None:
    request = max_size_request(model)
    memory = WorkerMemory(pids)
    with normal:
        codes = senders(port, request, clients, until=time.monotonic() + seconds)
        time.sleep(1.0)
    memory.report("max-size requests")
    normal.report("max-size requests")
    print(
        f"  {clients} clients looping valid {len(request) / MIB:.1f} MiB requests "
        f"for {seconds:.0f} s: {codes}"
    )


def idle_connections(http_port: int, normal: NormalClient, count: int, seconds: float) -> None:
    """``count`` connections to the REST port that send nothing, opened in waves: every ``WAVE_SECONDS`` the
    ones the server closed meanwhile (idle timeout, or to make room) are opened again, all at once."""
    sel = selectors.DefaultSelector()
    opened = closed = waves = 0

    def connect() -> None:
        nonlocal opened
        sock = socket.create_connection(("127.0.0.1", http_port), timeout=10)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        opened += 1

    def wave(n: int) -> None:
        nonlocal waves
        waves += 1
        for _ in range(n):
            connect()

    wave(count)
    with normal:
        until = time.monotonic() + seconds
        next_wave, gone = time.monotonic() + WAVE_SECONDS, 0
        while time.monotonic() < until:
            for key, _ in sel.select(0.2):
                sel.unregister(key.fileobj)
                key.fileobj.close()
                closed += 1
                gone += 1
            if time.monotonic() >= next_wave:
                wave(gone)
                next_wave, gone = time.monotonic() + WAVE_SECONDS, 0
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    normal.report("idle rest connections")
    print(
        f"  {count} idle connections held {seconds:.0f} s in {waves} waves: {opened} opened, "
        f"{closed} closed by the server"
    )


def alone(normal: NormalClient, seconds: float) -> None:
    """The normal client with no attack: what the machine's own load costs it."""
    with normal:
        time.sleep(seconds)
    normal.report("no attack")


def at_rest(server: subprocess.Popen, pids: list[int], seconds: float) -> None:
    """CPU seconds per minute the started server spends with no client at all."""
    procs = [server.pid, *pids]
    before = {pid: cpu_seconds(pid) for pid in procs}
    time.sleep(seconds)
    scale = 60.0 / seconds
    total = 0.0
    for name, pid in (("supervisor", server.pid), *((f"worker {i}", p) for i, p in enumerate(pids))):
        if pid == server.pid and pid in pids:
            continue
        used = (cpu_seconds(pid) - before[pid]) * scale
        total += used
        print(f"at rest {name} CPU-s per minute {used:.3f}")
    print(f"at rest server CPU-s per minute {total:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold", type=float, default=60.0, help="seconds of held streams")
    ap.add_argument("--flood", type=float, default=15.0, help="seconds of max-size requests")
    ap.add_argument("--clients", type=int, default=64, help="clients looping max-size requests")
    ap.add_argument("--idle", type=int, default=2200, help="idle REST connections")
    ap.add_argument("--idle-hold", type=float, default=30.0, help="seconds the idle connections are held")
    ap.add_argument(
        "--rest-seconds", type=float, default=30.0, help="seconds the server's CPU at rest is read"
    )
    ap.add_argument("--package", type=Path, help="the standard package, exported before (default: export it)")
    ap.add_argument("--alone", type=float, default=20.0, help="seconds of the normal client with no attack")
    phases = "rest,alone,held,rest_gzip,grpc_gzip,flood,idle"
    ap.add_argument("--phases", default=phases, help="what to run, in order")
    args = ap.parse_args()
    print_machine()
    budget = default_request_budget(WORKERS, MAX_MESSAGE)
    bound = budget + READ_MEMORY_SLACK + MAX_MESSAGE + GROWTH_CONSTANT
    print(f"request memory budget per worker MiB {budget / MIB:.0f}")
    print(f"documented memory bound per worker MiB {bound / MIB:.0f}")
    print(f"memory cap per worker MiB {CAP_MIB}")
    with tempfile.TemporaryDirectory(prefix="recserve-hostile-") as tmp:
        package = args.package or export_standard(Path(tmp) / "pkg")
        port, http_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "recserve.cli", "serve", "--package", str(package), "--port", str(port)]
        cmd += ["--workers", str(WORKERS), "--http-port", str(http_port), "--metrics-port", "-1"]
        cmd += ["--admin-port", "-1"]
        server = wait_serving(subprocess.Popen(cmd), port, timeout_s=600)
        try:
            time.sleep(2.0)  # both workers up (the health check reached one)
            pids = workers_of(server)
            model = PredictorClient(f"127.0.0.1:{port}").metadata()
            print(f"  server {server.pid}, workers {pids}, load average {os.getloadavg()[0]:.1f}")

            def normal() -> NormalClient:
                return NormalClient(port, http_port, model)

            phases = {
                "rest": lambda: at_rest(server, pids, args.rest_seconds),
                "alone": lambda: alone(normal(), args.alone),
                "held": lambda: held_streams(port, normal(), args.hold),
                "rest_gzip": lambda: stalled_gzip_uploads(http_port, model.model_name, normal(), pids),
                "grpc_gzip": lambda: gzip_messages(port, normal(), pids),
                "flood": lambda: max_size_flood(port, model, normal(), pids, args.flood, args.clients),
                "idle": lambda: idle_connections(http_port, normal(), args.idle, args.idle_hold),
            }
            for name in args.phases.split(","):
                phases[name]()
                time.sleep(2.0)  # what the attack left ends (408s, drains) before the next one starts
            print(f"  load average at the end {os.getloadavg()[0]:.1f}")
        finally:
            server.terminate()
            try:
                server.wait(120)
            except subprocess.TimeoutExpired:
                print("  the server did not drain within 120 s; killed")
                server.kill()
                server.wait()


if __name__ == "__main__":
    main()
