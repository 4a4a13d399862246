"""Default ``recserve serve`` against NVIDIA Triton on the same cores and requests, alternating (issue 37).

The model is the main job's int8 DLRM (26 tables x 1,000 x 16, bottom 13-64-16, top 64-32-1; seeded random
weights); the requests are OIP ``ModelInfer`` of 64 examples, 26 features, ids per example and feature
uniform 1..39 (~266 KB), raw tensors, sent by the project's load generator (closed loop for capacity, Poisson
open loop for latency). Triton 2.51 (the ``tritonserver`` of the ``nvidia-pytriton`` wheel, venv built by
scripts/triton_venv.sh) serves the model repository ``recserve export --triton-repository`` writes: the
Python backend running the server's own batch function behind Triton's dynamic batcher, one request per
batch item (leading dimension 1, ragged batching).

Per round, each pair runs Triton first, then recserve:

- Triton with N instances (one torch thread each) against recserve: N = cores against ``recserve serve``
  with no flag (the default), and N = 1 against ``--workers 1``;
- capacity (``--concurrency`` closed-loop callers), server CPU per request (the process tree's CPU time
  over the capacity run), then p99 / p99.9 of Poisson arrivals at 50 % of *Triton's* capacity for both.

Before the rounds both servers' scores are checked equal to the in-process predictor's on the same requests;
each round also measures the in-process predictor at batch 512 (served capacity / in-process is the issue's
0.3 goal). Ends with the ranges of the ratios over the rounds and whether every round met the goal.

    .venv/bin/python bench/serve_vs_triton.py [--rounds 3] [--duration 8] [--concurrency 32]
        [--triton-max-requests 8] [--triton-delay-us 2000] [--pairs cores,1]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import torch
from machine import print_machine
from serve_throughput import free_port, wait_serving
from triton_reference import backend_dir, start_triton, triton_venv, wait_model_ready

from recserve.client.client import ServedModel, SparseFeatureInfo
from recserve.client.loadgen import LoadgenConfig, run_loadgen
from recserve.client.oip_requests import MODEL_INFER_METHOD, build_infer_requests, infer_request, random_batch
from recserve.client.openloop import OpenLoopConfig, run_open_loop
from recserve.export import export_package
from recserve.export.triton_repository import TritonOptions, write_triton_repository
from recserve.runtime import Predictor
from recserve.server.dataplane.arrays import from_raw
from recserve.server.transports.protos import oip_pb2
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig

TABLES, ROWS, DIM, DENSE, BATCH = 26, 1000, 16, 13, 64
MODEL = "dlrm"


def export_main_job_model(out: Path) -> Path:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"cat_{i}"])
        for i in range(TABLES)
    ]
    cfg = ModelConfig(
        kind="dlrm",
        tables=tables,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[64, DIM],
        over_arch_layer_sizes=[64, 32, 1],
    )
    torch.manual_seed(0)
    state = build_model(cfg).state_dict()
    return export_package(out, model_config=cfg, state_dict=state, model_name=MODEL, force=True)


def served_model(predictor: Predictor) -> ServedModel:
    md = predictor.metadata
    features = [SparseFeatureInfo(f, md.num_embeddings[f], False, "int8") for f in md.feature_names]
    return ServedModel(md.model_name, md.version, md.dense_in_features, features, 512)


def in_process_examples_per_s(predictor: Predictor, batch: int = 512, iters: int = 40) -> float:
    """The predictor alone at batch 512: best of 4 windows (a busy neighbour only slows one), with the
    current torch threads."""
    dense, kjt = random_batch(served_model(predictor), batch, 20, torch.Generator().manual_seed(0))
    for _ in range(3):
        predictor.predict(dense, kjt)
    best = float("inf")
    for _ in range(4):
        start = time.perf_counter()
        for _ in range(iters // 4):
            predictor.predict(dense, kjt)
        best = min(best, time.perf_counter() - start)
    return batch * (iters // 4) / best


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and every process below it (workers, Triton's backend stubs)."""
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = int(fields[11]) + int(fields[12])
    tree, frontier = {pid}, [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier and p not in tree]
        tree.update(children)
        frontier = children
    return sum(times.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """One server under test: how to start it and how its requests are shaped."""

    name: str
    leading_one: bool
    start: object  # () -> (Popen, target)


@dataclass
class Measured:
    capacity: float  # examples/s, closed loop
    cpu_ms: float  # server CPU per request at capacity
    p99_ms: float = float("nan")  # open loop at 50 % of the pair's Triton capacity
    p999_ms: float = float("nan")
    errors: str = ""
    score_diff: float = 0.0


def check_scores(target: str, predictor: Predictor, leading_one: bool, count: int = 4) -> float:
    """Max |served - in-process| score over ``count`` random requests of the workload."""
    g = torch.Generator().manual_seed(123)
    worst = 0.0
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 1 << 28)]) as channel:
        call = channel.unary_unary(
            MODEL_INFER_METHOD,
            request_serializer=oip_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=oip_pb2.ModelInferResponse.FromString,
        )
        for _ in range(count):
            dense, kjt = random_batch(served_model(predictor), BATCH, 20, g)
            reply = call(infer_request(MODEL, dense, kjt, leading_one=leading_one), timeout=60)
            served = from_raw(reply.raw_output_contents[0], "float32")
            worst = max(worst, float((served - predictor.predict(dense, kjt)).abs().max()))
    return worst


def measure(
    server: Server, args: argparse.Namespace, predictor: Predictor, rate_rps: float | None
) -> Measured:
    """Capacity, CPU per request, and latency at ``rate_rps`` (None: half this server's own capacity)."""
    proc, target = server.start()
    try:
        diff = check_scores(target, predictor, server.leading_one)
        if diff > args.max_score_diff:
            raise SystemExit(f"{server.name}: scores differ from the in-process predictor's by {diff:.3g}")
        requests = build_infer_requests(served_model(predictor), BATCH, 16, leading_one=server.leading_one)
        closed = LoadgenConfig(target, args.concurrency, 2.0, BATCH, warmup_s=0.0, method=MODEL_INFER_METHOD)
        run_loadgen(closed, requests)  # warm-up: connections, batch sizes, caches
        # The server is idle while the callers start, so its CPU over the run is the timed requests'.
        cpu0 = tree_cpu_seconds(proc.pid)
        capacity = run_loadgen(replace(closed, duration_s=args.duration), requests)
        cpu = tree_cpu_seconds(proc.pid) - cpu0
        rps = capacity.requests / capacity.seconds
        m = Measured(capacity.examples_per_s, cpu / max(1, capacity.requests) * 1e3, score_diff=diff)
        m.errors = _errors(capacity.errors)
        rate = 0.5 * rps if rate_rps is None else rate_rps
        opened = run_open_loop(
            OpenLoopConfig(
                target, rate, args.duration, warmup_s=2.0, request_batch=BATCH, method=MODEL_INFER_METHOD
            ),
            requests,
        )
        m.p99_ms, m.p999_ms = opened.percentile_ms(99), opened.percentile_ms(99.9)
        m.errors += _errors(opened.errors, " open loop: ")
        return m
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _errors(errors: dict[str, int], prefix: str = "") -> str:
    return prefix + ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) if errors else ""


def recserve_server(package: Path, workers: int | None) -> Server:
    """``recserve serve`` with its defaults (``workers`` None) or ``--workers N``; free ports throughout."""

    def start():
        port = free_port()
        cmd = [sys.executable, "-m", "recserve.cli", "serve", "--package", str(package), "--port", str(port)]
        cmd += ["--metrics-port", str(free_port()), "--admin-port", str(free_port())]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONWARNINGS="ignore"), stderr=subprocess.DEVNULL)
        return wait_serving(proc, port), f"127.0.0.1:{port}"

    return Server("recserve default" if workers is None else f"recserve --workers {workers}", False, start)


def triton_server(package: Path, instances: int, args: argparse.Namespace, work: Path, venv: Path) -> Server:
    """Triton 2.51 serving the package's repository with ``instances`` model instances."""
    repository = work / f"triton-{instances}"
    options = TritonOptions(
        max_requests_per_batch=args.triton_max_requests,
        max_queue_delay_us=args.triton_delay_us,
        instances=instances,
    )
    write_triton_repository(package, repository, options)
    backends = backend_dir(venv, work)

    def start():
        port = free_port()
        proc = start_triton(venv, repository, backends, port, free_port(), work / f"triton-{instances}.log")
        target = f"127.0.0.1:{port}"
        wait_model_ready(proc, target, MODEL)
        return proc, target

    return Server(f"Triton x{instances}", True, start)


def line(name: str, m: Measured) -> str:
    errors = f"; errors: {m.errors}" if m.errors else ""
    return (
        f"  {name:<22} {m.capacity:>9,.0f} examples/s  CPU {m.cpu_ms:5.2f} ms/request  "
        f"p99 {m.p99_ms:6.1f} ms  p99.9 {m.p999_ms:6.1f} ms{errors}"
    )


def in_process_best(predictor: Predictor, cores: int) -> float:
    """The in-process denominator: the better of one thread per core and one thread. On a shared machine
    intra-op threads that wait for each other can fall far below one thread (2.6k against 40k examples/s
    seen at load average 16), so one thread bounds it from below; the goal's ratio takes the better."""
    rates = []
    for threads in (cores, 1):
        torch.set_num_threads(threads)
        rates.append(in_process_examples_per_s(predictor))
    torch.set_num_threads(cores)
    print(
        f"  in-process predictor, batch 512: {rates[0]:,.0f} examples/s ({cores} threads), {rates[1]:,.0f} "
        f"(1 thread); load average {os.getloadavg()[0]:.1f}"
    )
    return max(rates)


def one_round(pairs, args, predictor) -> list[tuple[str, Measured, Measured, float]]:
    inproc = in_process_best(predictor, len(os.sched_getaffinity(0)))
    out = []
    for triton, ours in pairs:
        t = measure(triton, args, predictor, None)
        print(line(triton.name, t), flush=True)
        r = measure(ours, args, predictor, 0.5 * t.capacity / BATCH)
        print(line(ours.name, r), flush=True)
        print(
            f"  {ours.name} / {triton.name}: capacity {r.capacity / t.capacity:.2f}x, "
            f"p99 at 50 % of Triton's capacity {r.p99_ms / t.p99_ms:.2f}x, CPU per request "
            f"{r.cpu_ms / t.cpu_ms:.2f}x; served / in-process {r.capacity / inproc:.2f}",
            flush=True,
        )
        out.append((f"{ours.name} / {triton.name}", t, r, inproc))
    return out


def summary(rounds: list[list[tuple[str, Measured, Measured, float]]]) -> None:
    print(f"\nover {len(rounds)} rounds (range):")
    for i, (name, *_rest) in enumerate(rounds[0]):
        rows = [r[i] for r in rounds]
        cap = [r.capacity / t.capacity for _, t, r, _ in rows]
        p99 = [r.p99_ms / t.p99_ms for _, t, r, _ in rows]
        cpu = [r.cpu_ms / t.cpu_ms for _, t, r, _ in rows]
        served = [r.capacity / inproc for _, _, r, inproc in rows]
        print(
            f"  {name}: capacity {min(cap):.2f}-{max(cap):.2f}x, p99 {min(p99):.2f}-{max(p99):.2f}x, "
            f"CPU/request {min(cpu):.2f}-{max(cpu):.2f}x, "
            f"served/in-process {min(served):.2f}-{max(served):.2f}"
        )
        if i == 0:
            met = sum(c >= 1.5 and p <= 1.0 and s >= 0.3 for c, p, s in zip(cap, p99, served))
            print(
                f"  goal (capacity >= 1.5x, p99 <= Triton's, served >= 0.3 of in-process) met in {met} of "
                f"{len(rounds)} rounds"
            )
            # The recorded figures (python -m bench): the default server against Triton, worst round of each.
            print(f"capacity vs triton {min(cap):.2f}")
            print(f"p99 at half load vs triton {max(p99):.2f}")
            print(f"served vs in-process {min(served):.2f}")
            print(f"goal rounds met {met}")


def main() -> None:
    print_machine()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per closed and open-loop run")
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop callers (capacity)")
    ap.add_argument(
        "--pairs", default="cores,1", help="Triton instances vs recserve: cores (default) and/or 1"
    )
    ap.add_argument("--triton-max-requests", type=int, default=8, help="requests per Triton batch")
    ap.add_argument("--triton-delay-us", type=int, default=2000, help="Triton's max_queue_delay_microseconds")
    ap.add_argument("--max-score-diff", type=float, default=1e-6, help="allowed |served - in-process| score")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    venv = triton_venv()
    with tempfile.TemporaryDirectory(prefix="recserve-vs-triton-") as tmp:
        work = Path(tmp)
        package = export_main_job_model(work / "pkg")
        predictor = Predictor.load(package)
        pairs = []
        for which in args.pairs.split(","):
            if which == "cores":
                pairs.append(
                    (triton_server(package, cores, args, work, venv), recserve_server(package, None))
                )
            else:
                n = int(which)
                pairs.append((triton_server(package, n, args, work, venv), recserve_server(package, n)))
        rounds = []
        for k in range(1, args.rounds + 1):
            print(f"round {k} of {args.rounds}", flush=True)
            rounds.append(one_round(pairs, args, predictor))
        summary(rounds)


if __name__ == "__main__":
    main()
