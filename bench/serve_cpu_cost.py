"""CPU cost of serving: CPU-seconds the server spends per 1,000 examples, against the in-process predictor's.

Wall-clock capacity means little on a machine shared with other work; the CPU time a process was given does
not depend on how many neighbours it had. So this bench exports the standard DLRM (bench/serve_throughput.py),
measures the in-process ``Predictor.predict`` CPU time (this process's, all threads) per 1,000 examples at
batch 512 (what the server's batcher merges 64-example requests into) and at batch 64, then starts
``recserve serve`` (``--workers``, 2) and drives it with a closed loop (``--concurrency`` 32 callers x 64
examples), reading the server's CPU time (parent and workers, user + system, /proc/<pid>/stat) and the
load generator's caller processes' at the start and the end of the callers' measured window (timed from
the instant they start together, so neither process start-up nor the time spent spawning them counts).
The served/in-process ratio that a machine given wholly to the server would show is the in-process cost
over the served cost (the load generator's own CPU, printed too, is not counted: the issue measures from
another machine).

    .venv/bin/python bench/serve_cpu_cost.py [--duration 10] [--concurrency 32] [--workers 2]
        [--server-path DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch
from machine import print_machine
from serve_throughput import DENSE, E, L, T, export_standard, free_port, server_command, wait_serving

from recserve.client.loadgen import LoadgenConfig, requests_for, run_loadgen
from recserve.runtime import Predictor
from rectrain.sparse import KeyedJaggedTensor

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15)


def server_pids(server: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
    return [server.pid, *(int(p) for p in out)]


def own_cpu_s() -> float:
    """This process's CPU seconds (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s(server_pid: int) -> float:
    """CPU seconds of this process's live children but the server: the load generator's callers."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    total = 0.0
    for pid in (int(p) for p in out if int(p) != server_pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):  # one just exited
            total += process_cpu_s(pid)
    return total


class Window:
    """CPU seconds of the server and of the load generator between ``start`` and ``end`` (perf_counter
    instants), read by a thread that sleeps until each."""

    def __init__(self, server_pids: list[int], server_pid: int) -> None:
        self.server_pids, self.server_pid = server_pids, server_pid
        self.server_s = self.client_s = 0.0
        self._thread: threading.Thread | None = None

    def read(self) -> tuple[float, float]:
        return sum(map(process_cpu_s, self.server_pids)), children_cpu_s(self.server_pid)

    def measure(self, start: float, end: float) -> None:
        def run() -> None:
            time.sleep(max(0.0, start - time.perf_counter()))
            server0, client0 = self.read()
            time.sleep(max(0.0, end - time.perf_counter()))
            server1, client1 = self.read()
            self.server_s, self.client_s = server1 - server0, client1 - client0

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def in_process_cpu_s_per_1k(package: Path, batch: int, workers: int, examples: int = 30_000) -> float:
    """CPU seconds of this process per 1,000 examples of ``Predictor.predict`` at ``batch``."""
    predictor = Predictor.load(package, device="cpu")
    # One worker's intra-op threads (the server's default): more would add OpenMP's spin-waiting to the cost.
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2 * L, (T * batch,), generator=g)
    values = torch.randint(0, E, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(T)], values=values, lengths=lengths)
    dense = torch.randn(batch, DENSE, generator=g)
    for _ in range(5):
        predictor.predict(dense, kjt)
    iters = max(1, examples // batch)
    start = own_cpu_s()
    for _ in range(iters):
        predictor.predict(dense, kjt)
    return (own_cpu_s() - start) / (iters * batch) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of the measured closed loop")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64, help="examples per request")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-batch-size", type=int, default=512)
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    ap.add_argument("--package", default="", help="a standard package to reuse (default: export one)")
    ap.add_argument(
        "--server-path",
        default="",
        help="run the server from this checkout (its PYTHONPATH), e.g. a worktree of an older commit, so "
        "that two versions are measured with the same load generator",
    )
    ap.add_argument(
        "--profile",
        default="",
        help="sample one worker with py-spy (a dev tool, not a dependency) over the window, into this file",
    )
    args = ap.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory(prefix="recserve-cpu-cost-") as tmp:
        package = Path(args.package) if args.package else export_standard(Path(tmp) / "pkg")
        inproc = {b: in_process_cpu_s_per_1k(package, b, args.workers) for b in (512, args.batch)}
        port = free_port()
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        if args.server_path:
            env["PYTHONPATH"] = str(Path(args.server_path).resolve())
        server = wait_serving(subprocess.Popen(server_command(package, port, args), env=env), port, 900)
        try:
            pids = server_pids(server)
            cfg = LoadgenConfig(f"127.0.0.1:{port}", args.concurrency, 3.0, args.batch, warmup_s=1.0)
            requests = requests_for(cfg)
            run_loadgen(cfg, requests)  # warm-up: every worker's threads and batch shapes
            # The server's CPU at rest (watch ticks, probes), for reference: it is part of the served cost.
            idle, idle_s = sum(map(process_cpu_s, pids)), 3.0
            time.sleep(idle_s)
            idle_rate = (sum(map(process_cpu_s, pids)) - idle) / idle_s
            target = f"127.0.0.1:{port}"
            cfg = LoadgenConfig(target, args.concurrency, args.duration, args.batch, warmup_s=1.0)
            window = Window(pids, server.pid)
            spy = None
            if args.profile:  # --nonblocking: the worker is never paused, so its CPU cost stays its own
                spy = subprocess.Popen(
                    ["py-spy", "record", "--pid", str(pids[-1]), "--duration", str(int(args.duration)),
                     "--rate", "100", "--nonblocking", "--format", "raw", "-o", args.profile],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            result = run_loadgen(
                cfg,
                requests,
                on_go=lambda t0: window.measure(t0 + cfg.warmup_s, t0 + cfg.warmup_s + cfg.duration_s),
            )
            window.join()
            served_cpu, client_cpu = window.server_s, window.client_s
            if spy is not None:
                spy.wait(60)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    examples = result.requests * args.batch
    served = served_cpu / examples * 1000
    print(f"closed loop: {result.summary()}")
    shape = f"{args.workers} workers, {args.concurrency} callers x {args.batch} examples"
    print(f"server: {shape}, {result.seconds:.1f} s measured")
    print(f"server CPU-s per s at rest {idle_rate:.4f}")
    print(f"in-process CPU-s per 1k examples at batch 512 {inproc[512]:.4f}")
    print(f"in-process CPU-s per 1k examples at batch {args.batch} {inproc[args.batch]:.4f}")
    print(f"server CPU-s per 1k examples served {served:.4f}")
    print(f"load generator CPU-s per 1k examples (not counted) {client_cpu / examples * 1000:.4f}")
    print(f"served vs in-process by CPU cost {inproc[512] / served:.3f}")


if __name__ == "__main__":
    main()
