"""Freshness: how soon a following server serves what training just learned (issue 45).

Trains the DLRM (``--tables`` x ``--rows`` x ``--dim``, int8 bases; synthetic click data) online on
``--ranks`` ranks with ``[publish] every_seconds = --every``, starts ``recserve serve --follow`` with
``--workers`` workers, and keeps a closed loop of ``--clients`` callers on it until ``--publishes`` deltas
written after its first reply have been served (30 by default). Then, with the server and its callers still
running, the same training runs for ``--baseline-s`` seconds without publishing, for the throughput ratio:
both runs share the machine with the same serving load. It prints one line per figure, its value last:

- ``freshness p50 s`` / ``freshness p99 s``: from the time the trainer read a delta's rows (its ``wall_time``)
  to the first reply that names that version (or a later one); deltas written before the server's first
  reply waited for it to start, not to follow, and are only counted
  (``deltas published before the server served``);
- ``failed requests``;
- ``apply p99 / steady p99``: reply latency within 0.25 s of a new version's first reply vs the rest;
- ``delta bytes / touched row bytes``: the deltas' row files vs their rows x int8 row bytes (dim + 4: codes,
  fp16 scale and bias); the files also hold each row's int64 id, so (dim + 12) / (dim + 4) is the floor;
- ``train throughput publishing / not``: median examples/s of the logged windows while the callers run
  (the publishing run's windows after its first base, so the base export at its start is not in it; the
  other run's past its first two);
- ``peak memory <process> MiB``: VmHWM of every trainer rank and serving worker (it counts the pages of
  files a process maps, which the workers share and map twice);
- ``peak private memory <process> MiB``: the most anonymous memory (``Anonymous`` of
  ``/proc/<pid>/smaps_rollup``, sampled every 0.25 s): what a process holds for itself;
- ``worker private growth / applied delta bytes``: each worker's growth of anonymous memory from the first
  reply to the end over the row bytes of the deltas it applied meanwhile (the most of the workers).

    .venv/bin/python -m bench freshness [--rows 2000000] [--ranks 2] [--workers 2] [--publishes 30]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from machine import print_machine
from serve_throughput import free_port, wait_serving

from recserve.client import PredictorClient
from recserve.client.loadgen import build_requests
from recserve.v1 import predictor_pb2 as pb2

ROOT = Path(__file__).resolve().parents[1]


def run_config(args: argparse.Namespace, out: Path, publish: bool) -> Path:
    tables = ", ".join(
        f'{{ name = "t{i}", num_embeddings = {args.rows}, embedding_dim = {args.dim}, '
        f'feature_names = ["cat_{i}"] }}'
        for i in range(args.tables)
    )
    text = f"""
[model]
kind = "dlrm"
dense_in_features = 13
dense_arch_layer_sizes = [512, 256, {args.dim}]
over_arch_layer_sizes = [512, 256, 1]
tables = [{tables}]
[data]
source = "synthetic"
ids_per_feature = [1, 4]
[train]
batch_size = {args.batch}
steps = 100000000
log_every = 20
metrics_log = "{out / "metrics.jsonl"}"
[checkpoint]
dir = "{out / "ckpt"}"
keep_last = 1
"""
    if publish:
        text += f'[publish]\ndir = "{out / "publish"}"\nevery_seconds = {args.every}\nbase_every = 100000\n'
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.toml").write_text(text)
    return out / "run.toml"


def start_training(args: argparse.Namespace, config: Path) -> subprocess.Popen:
    """torchrun with ``--ranks`` ranks; its output (and the ranks') goes to ``trainer.log`` beside the
    config, shown only when the trainer ends otherwise than as ``stop_training`` ends it."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.ranks}"]
    command += ["-m", "rectrain", "train", "--config", str(config), "--no-progress"]
    with open(config.parent / "trainer.log", "wb") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)


def stop_training(process: subprocess.Popen, log: Path) -> None:
    """SIGTERM to the ranks, not to torchrun: each checkpoints and exits 143 (stopped, resumable), and
    torchrun, which was not signalled, reports that and ends (signalled itself, it raises a
    ``SignalException``). Shows the log when a rank ended otherwise."""
    if process.poll() is None:
        ranks = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout
        for rank in map(int, ranks.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGTERM)
        try:
            process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text(errors="replace") if log.exists() else ""
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", text))
    if process.returncode != 0 and not codes <= {"143"}:
        print(f"freshness: the trainer ended with {process.returncode}; its log's end:", file=sys.stderr)
        print(text[-4000:], file=sys.stderr)


def throughput(metrics: Path, since: float | None = None) -> float:
    """Median examples/s of the logged windows ending after ``since``, or past the first two (warm-up)."""
    events = [e for e in map(json.loads, metrics.read_text().splitlines()) if e["event"] == "train"]
    if since is not None:
        rates = [e["examples_per_s"] for e in events if e["time"] > since]
    else:
        rates = [e["examples_per_s"] for e in events][2:]
    return statistics.median(rates or [0.0])


def train_windows(metrics: Path) -> int:
    return sum(1 for line in metrics.read_text().splitlines() if '"event": "train"' in line)


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from ``/proc/<pid>/stat`` (read here: a ``pgrep`` per process and sample
    cost the publishing run ~15 ms of CPU each, several times a second, and the baseline run nothing)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Child processes, recursively, less multiprocessing's resource tracker (a helper of spawned workers)."""
    children = children_by_parent() if children is None else children
    kids = [c for c in children.get(pid, []) if "resource_tracker" not in cmdline(c)]
    return kids + [g for c in kids for g in descendants(c, children)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def peak_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) / 1024


def anonymous_mib(pid: int) -> float | None:
    """A process's anonymous memory (its own pages: heap, tensors, private writes), not the file pages it
    maps; None once it is gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    line = next((x for x in rollup.splitlines() if x.startswith("Anonymous:")), "Anonymous: 0 kB")
    return int(line.split()[1]) / 1024


class Memory:
    """Samples the anonymous memory of the watched processes' descendants every 0.25 s: each one's peak,
    its value at ``mark_start`` and at ``stop``; VmHWM at ``stop``."""

    def __init__(self) -> None:
        self.groups: dict[str, list[int]] = {}
        self.peak: dict[int, float] = {}
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.hwm: dict[int, float] = {}
        self.stopped_at = float("inf")
        self._listed_at = 0.0
        self._parents: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, kind: str, pid: int) -> None:
        with self._lock:
            self._parents[kind] = pid

    def _sample(self) -> dict[int, float]:
        with self._lock:
            parents = dict(self._parents)
        now = {}
        # The process tree is looked up once a second at most (it changes only when a run starts).
        if time.monotonic() - self._listed_at > 1 or set(parents) - set(self.groups):
            children = children_by_parent()
            for kind, parent in parents.items():
                pids = descendants(parent, children)
                if pids:
                    self.groups[kind] = pids
            self._listed_at = time.monotonic()
        for kind in parents:
            for pid in self.groups.get(kind, []):
                value = anonymous_mib(pid)
                if value is not None:
                    now[pid] = value
                    self.peak[pid] = max(self.peak.get(pid, 0.0), value)
        return now

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def mark_start(self) -> None:
        self.start = self._sample()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.end = self._sample()
        self.hwm = {pid: peak_mib(pid) for group in self.groups.values() for pid in group}
        self.stopped_at = time.time()


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"freshness: timed out waiting for {what}")
        time.sleep(0.1)


class Load:
    """``clients`` closed-loop callers; each reply kept as (sent, received, version), or counted failed."""

    def __init__(self, target: str, clients: int, batch: int) -> None:
        with PredictorClient(target) as client:
            model = client.metadata()
        self.requests = [pb2.PredictRequest.FromString(r) for r in build_requests(model, batch, 16, 4, 0)]
        self.target, self.replies, self.failed = target, [], 0
        self.failures: collections.Counter[str] = collections.Counter()  # by status code, for the report
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(clients)]

    def _loop(self, index: int) -> None:
        with PredictorClient(self.target) as client:
            stub = client._predictor  # the raw stub: the reply's version is what is measured
            i = index
            while not self._stop.is_set():
                sent = time.time()
                try:
                    reply = stub.Predict(self.requests[i % len(self.requests)], timeout=5)
                except Exception as error:  # noqa: BLE001 - every failure counts, whatever its kind
                    self.failed += 1
                    code = error.code() if isinstance(error, grpc.RpcError) else None
                    self.failures[code.name if code is not None else type(error).__name__] += 1
                    continue
                self.replies.append((sent, time.time(), reply.model_version))
                i += 1

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def version_key(version: str) -> tuple[int, int]:
    base, _, sequence = version.partition(".")
    return int(base), int(sequence or 0)


_MANIFESTS: dict[Path, dict] = {}  # a delta is complete once visible: each manifest is read once


def deltas_of(publish: Path) -> dict[tuple[int, int], dict]:
    found = {}
    for manifest in publish.glob("*-deltas/*/manifest.json"):
        data = _MANIFESTS.get(manifest)
        if data is None:
            data = json.loads(manifest.read_text())
            rows_file = manifest.parent / "rows.safetensors"
            data["rows_bytes"] = rows_file.stat().st_size if rows_file.exists() else 0
            _MANIFESTS[manifest] = data
        found[(int(data["base_version"]), int(data["sequence"]))] = data
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1024, help="training batch per rank")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--request-batch", type=int, default=64)
    p.add_argument("--every", type=float, default=1.0, help="publish.every_seconds")
    p.add_argument("--publishes", type=int, default=30, help="deltas to serve before stopping")
    p.add_argument("--baseline-s", type=float, default=60, help="seconds of training without publishing")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    print_machine()
    print(
        f"model {args.tables} x {args.rows} x {args.dim}, {args.ranks} ranks, {args.workers} workers",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="freshness-") as tmp:
        root = Path(tmp)
        online = root / "online"
        trainer = start_training(args, run_config(args, online, publish=True))
        publish = online / "publish"
        memory = Memory()
        memory.watch("trainer rank", trainer.pid)
        wait_for(lambda: (publish / "1" / "manifest.json").exists(), args.timeout, "the first base")
        port, metrics_port = free_port(), free_port()
        command = [sys.executable, "-m", "recserve.cli", "serve", "--follow", str(publish)]
        command += ["--port", str(port), "--workers", str(args.workers), "--metrics-port", str(metrics_port)]
        server = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
        baseline = None
        try:
            wait_serving(server, port, timeout_s=args.timeout)
            memory.watch("serving worker", server.pid)
            with Load(f"127.0.0.1:{port}", args.clients, args.request_batch) as load:

                def served_enough() -> bool:
                    """``--publishes`` deltas written after the first reply have been served."""
                    if not load.replies:
                        return False
                    since = load.replies[0][1]
                    newest = max(version_key(v) for _, _, v in load.replies[-200:])
                    served = [
                        key
                        for key, delta in deltas_of(publish).items()
                        if delta["wall_time"] >= since and key[0] == newest[0] and key <= newest
                    ]
                    return len(served) >= args.publishes

                wait_for(lambda: bool(load.replies), args.timeout, "the first reply")
                memory.mark_start()
                wait_for(served_enough, args.timeout, f"{args.publishes} served deltas")
                memory.stop()
                publishing = throughput(online / "metrics.jsonl", since=load.replies[0][1])
                stop_training(trainer, online / "trainer.log")
                # The same training without publishing, under the same serving load (the server keeps
                # serving the last version).
                baseline = start_training(args, run_config(args, root / "baseline", publish=False))
                # Sampled as the publishing run is, so the sampler's own CPU weighs on both runs alike.
                baseline_memory = Memory()
                baseline_memory.watch("trainer rank", baseline.pid)
                baseline_memory.watch("serving worker", server.pid)
                log = root / "baseline" / "metrics.jsonl"
                wait_for(log.exists, args.timeout, "its first log")
                time.sleep(args.baseline_s)
                wait_for(lambda: train_windows(log) >= 5, args.timeout, "5 logged windows (2 of warm-up)")
                baseline_memory.stop()
                stop_training(baseline, root / "baseline" / "trainer.log")
                replies_until = memory.stopped_at
            not_publishing = throughput(root / "baseline" / "metrics.jsonl")
            print(f"train examples/s publishing {publishing:.0f}", flush=True)
            print(f"train examples/s not publishing {not_publishing:.0f}", flush=True)
        finally:
            memory.stop()
            for process in (trainer, baseline, server):
                if process is not None:
                    stop(process)
        load.replies = [r for r in load.replies if r[1] <= replies_until]
        report(load, deltas_of(publish), args, publishing / max(not_publishing, 1e-9), memory)


def report(load: Load, deltas: dict, args: argparse.Namespace, train_ratio: float, memory: Memory) -> None:
    replies = sorted(load.replies, key=lambda r: r[1])
    first_seen: dict[tuple[int, int], float] = {}
    for _, received, version in replies:
        first_seen.setdefault(version_key(version), received)
    served = sorted(first_seen)
    # Deltas the trainer wrote before the load's first reply waited for the server to start, not to follow:
    # they are not freshness samples.
    serving_since = replies[0][1] if replies else float("inf")
    freshness, before_serving = [], 0
    for key, delta in sorted(deltas.items()):
        if delta["wall_time"] < serving_since:
            before_serving += 1
            continue
        later = [first_seen[v] for v in served if v[0] == key[0] and v >= key]
        if later:
            freshness.append(min(later) - delta["wall_time"])
    applies = [t for v, t in first_seen.items() if v[1]]
    apply, steady = [], []
    for sent, received, _ in replies:
        near = any(abs(received - t) <= 0.25 for t in applies)
        (apply if near else steady).append(received - sent)
    row_bytes = args.dim + 4  # int8 codes + fp16 scale and bias
    rows = sum(t["rows"] for d in deltas.values() for t in d["tables"].values())
    rows_bytes = sum(d["rows_bytes"] for d in deltas.values())
    freshness.sort()
    print(f"deltas published before the server served (not counted) {before_serving}")
    print(f"deltas served {len(freshness)}")
    print(f"freshness p50 s {percentile(freshness, 50):.3f}")
    print(f"freshness p99 s {percentile(freshness, 99):.3f}")
    for kind, count in sorted(load.failures.items()):
        print(f"failed requests {kind}: {count}")
    print(f"failed requests {load.failed}")
    apply_p99, steady_p99 = percentile(sorted(apply), 99), percentile(sorted(steady), 99)
    print(f"steady p99 ms {steady_p99 * 1e3:.2f}")
    print(f"apply p99 ms {apply_p99 * 1e3:.2f}")
    print(f"apply p99 / steady p99 {apply_p99 / max(steady_p99, 1e-9):.3f}")
    print(f"delta bytes / touched row bytes {rows_bytes / max(rows * row_bytes, 1):.3f}")
    print(f"train throughput publishing / not {train_ratio:.3f}")
    for kind, pids in memory.groups.items():
        for i, pid in enumerate(pids):
            print(f"peak memory {kind} {i} MiB {memory.hwm.get(pid, 0.0):.0f}")
            print(f"peak private memory {kind} {i} MiB {memory.peak.get(pid, 0.0):.0f}")
    # The deltas the workers applied between the first reply and the end: those after the version of the
    # first reply, up to the last one served.
    first, last = version_key(replies[0][2]), version_key(replies[-1][2])
    applied = sum(d["rows_bytes"] for key, d in deltas.items() if key[0] == last[0] and first < key <= last)
    growth = [
        memory.end[pid] - memory.start[pid]
        for pid in memory.groups.get("serving worker", [])
        if pid in memory.start and pid in memory.end
    ]
    print(f"delta row bytes applied while measured MiB {applied / 2**20:.1f}")
    if growth and applied:
        print(f"worker private growth / applied delta bytes {max(growth) * 2**20 / applied:.3f}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


if __name__ == "__main__":
    main()
