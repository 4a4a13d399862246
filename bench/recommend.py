"""Recommend served: a two-tower + DLRM pipeline over an item catalogue, its index, latency and capacity.

Builds (seeded weights) a two-tower package (users x 64 and items x 64 tables, towers ending in 64 dims; the
user and item rows drawn around 1,000 centres each, as trained tables cluster them) and a small DLRM ranking
package (``ranking_config``: user, item and genre tables of 64 dims, bottom MLP 128-64, top MLP 256-64-1),
writes a generated catalogue of ``--items`` items, exports the pipeline (the index chosen by size, its
recall@100 measured against exact search on 256 sampled queries), then starts ``recserve serve <pipeline>``
with ``--workers`` processes and calls ``Recommend`` over gRPC (N = ``--candidates`` ranked, K = ``--k``):

1. closed loop: ``--concurrency`` callers, each sending its next request when the last returns: capacity;
2. open loop: Poisson arrivals at ``--rate`` requests/s, latency from each request's scheduled arrival;
3. each worker's memory from ``/proc/<pid>/smaps_rollup``: what it alone holds (private dirty and anonymous
   pages), beside the package's mapped files that every worker shares.

    .venv/bin/python bench/recommend.py [--items 1000000] [--candidates 1000] [--k 100] [--workers 2]
        [--rate 100] [--duration 10] [--concurrency 8] [--connections 8] [--index-only]

``--index-only`` builds the index over ``--items`` synthetic clustered 64-dim embeddings and stops (the
index build figure alone). Objective (issue 47, 1M items, quiet machine): p99 <= 30 ms at 100 rps,
capacity >= 300 rps, ann recall@100 >= 0.95, index build <= 120 s, worker private memory <= 512 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import torch
from machine import print_machine
from serve_cpu_cost import process_cpu_s
from serve_throughput import free_port, wait_serving

from recserve.export import export_package
from recserve.recommend.export import export_pipeline
from recserve.recommend.index import build_index
from recserve.recommend.manifest import Limits
from recserve.runtime.dense_precision import choose_dense_dtype
from recserve.server.dataplane.arrays import encode_raw
from recserve.server.transports.protos import pb2, pb2_grpc
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig

USERS, GENRES, DIM, USER_DENSE, CLUSTERS = 100_000, 100, 64, 4, 1000


def _export(out: Path, cfg: ModelConfig, name: str, seed: int, clustered: tuple[str, ...] = ()) -> Path:
    torch.manual_seed(seed)
    state = build_model(cfg).state_dict()
    g = torch.Generator().manual_seed(seed)
    for table in clustered:
        # Trained towers place similar users and similar items together; seeded random rows would scatter
        # them uniformly, which no index is built for, and rows at the tables' small initial scale would
        # leave every query the tower's bias (one direction, the same top items for every user). The
        # tables' rows are drawn around CLUSTERS centres instead, at the scale of trained rows.
        rows = state[table]
        centres = torch.randn(CLUSTERS, rows.shape[1], generator=g)
        member = torch.randint(0, CLUSTERS, (rows.shape[0],), generator=g)
        state[table] = centres[member] + 0.5 * torch.randn(rows.shape, generator=g)
    return export_package(out, model_config=cfg, state_dict=state, model_name=name, force=True)


def ranking_config(items: int) -> ModelConfig:
    """A small DLRM ranker: 64-dim rows of user (100k), item and genre (100, two per item) tables, the
    user's 4 dense values and the item's popularity, bottom MLP 128-64, top MLP 256-64-1."""
    return ModelConfig(
        kind="dlrm",
        tables=[
            EmbeddingBagConfig(
                name="r_user", num_embeddings=USERS, embedding_dim=DIM, feature_names=["user"]
            ),
            EmbeddingBagConfig(
                name="r_item", num_embeddings=items, embedding_dim=DIM, feature_names=["item"]
            ),
            EmbeddingBagConfig(
                name="genre_t", num_embeddings=GENRES, embedding_dim=DIM, feature_names=["genre"]
            ),
        ],
        dense_in_features=USER_DENSE + 1,
        dense_arch_layer_sizes=[128, DIM],
        over_arch_layer_sizes=[256, 64, 1],
    )


def write_catalogue(path: Path, items: int) -> Path:
    """``items`` rows: id, the item's own id, two genres, a popularity; written a block at a time."""
    rng = np.random.default_rng(0)
    with path.open("w") as f:
        f.write("item_id\titem\tgenre\tdense:popularity\n")
        for start in range(0, items, 100_000):
            n = min(100_000, items - start)
            genres = rng.integers(0, GENRES, (n, 2))
            popularity = rng.random(n)
            f.writelines(
                f"{10_000_000 + start + i}\t{start + i}\t{g[0]},{g[1]}\t{p:.4f}\n"
                for i, g, p in zip(range(n), genres.tolist(), popularity.tolist())
            )
    return path


def build_pipeline(root: Path, items: int, limits: Limits) -> tuple[Path, float]:
    """The pipeline package and the seconds ``export_pipeline`` took (catalogue, item tower, index)."""
    tower = ModelConfig(
        kind="two_tower",
        tables=[
            EmbeddingBagConfig(
                name="user_t", num_embeddings=USERS, embedding_dim=DIM, feature_names=["user"]
            ),
            EmbeddingBagConfig(
                name="item_t", num_embeddings=items, embedding_dim=DIM, feature_names=["item"]
            ),
        ],
        dense_in_features=0,
        tower_layer_sizes=[128, DIM],
    )
    tables = ("model.ebc.embedding_bags.user_t.weight", "model.ebc.embedding_bags.item_t.weight")
    retrieval = _export(root / "tt", tower, "towers", 1, clustered=tables)
    rank = _export(root / "rank", ranking_config(items), "ranker", 2)
    catalogue = write_catalogue(root / "items.tsv", items)
    started = time.perf_counter()
    out = export_pipeline(
        root / "pipe", retrieval=retrieval, ranking=rank, catalogue=catalogue, limits=limits
    )
    return out, time.perf_counter() - started


def worker_pids(server: int) -> list[int]:
    """The serving workers: the server's spawned children, less multiprocessing's resource tracker."""
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    return [int(p) for p in children if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]


def worker_memory(server: int) -> list[dict[str, int]]:
    """``/proc/<pid>/smaps_rollup`` of each serving worker, in kB."""
    out = []
    for pid in worker_pids(server):
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
        out.append(fields)
    return out


def request_for(user: int, args: argparse.Namespace) -> pb2.RecommendRequest:
    req = pb2.RecommendRequest(k=args.k, num_candidates=args.candidates)
    req.dense.raw = encode_raw(torch.randn(1, USER_DENSE), "float32")
    req.sparse.keys.append("user")
    req.sparse.lengths_raw = encode_raw(torch.ones(1), "int32")
    req.sparse.values_raw = encode_raw(torch.tensor([user]), "int64")
    return req


def connect(port: int, connections: int) -> list:
    """``connections`` stubs, each over its own TCP connection (a local subchannel pool: channels to one
    target otherwise share one connection). The kernel spreads connections, not calls, over the workers:
    through one connection every call would reach one worker and the others would idle."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    return [
        pb2_grpc.PredictorStub(grpc.insecure_channel(f"127.0.0.1:{port}", options=options))
        for _ in range(connections)
    ]


def closed_loop(stubs: list, args: argparse.Namespace, batch_candidates: list[int]) -> float:
    """Requests/s with ``--concurrency`` callers for ``--duration`` s (after 2 s of warm-up), caller ``c``
    on connection ``c % len(stubs)``; each reply's batch (candidates ranked in it) goes to
    ``batch_candidates``. A caller refused by the server's admission (RESOURCE_EXHAUSTED) backs off 5 ms and
    sends the request again."""
    requests = [request_for(u, args) for u in range(0, USERS, USERS // 256)]
    done, stop, start = [0], threading.Event(), [0.0]

    def caller(seed: int) -> None:
        i, stub = seed, stubs[seed % len(stubs)]
        while not stop.is_set():
            try:
                reply = stub.Recommend(requests[i % len(requests)], timeout=30)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                time.sleep(0.005)
                continue
            i += args.concurrency
            if start[0]:
                done[0] += 1
                batch_candidates.append(reply.timings.executed_batch_size)

    threads = [threading.Thread(target=caller, args=(c,), daemon=True) for c in range(args.concurrency)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    start[0] = time.perf_counter()
    time.sleep(args.duration)
    count, elapsed = done[0], time.perf_counter() - start[0]
    stop.set()
    for t in threads:
        t.join()
    return count / elapsed


def open_loop(stubs: list, args: argparse.Namespace) -> tuple[list[float], int, int]:
    """Latencies (s) of Poisson arrivals at ``--rate`` (request ``i`` on connection ``i % len(stubs)``),
    each from its scheduled arrival, of the requests
    answered; how many were refused by the server's admission (RESOURCE_EXHAUSTED: an offered load over
    capacity), and how many failed otherwise (such as the 30 s deadline)."""
    requests = [request_for(u, args) for u in range(0, USERS, USERS // 256)]
    rng = np.random.default_rng(0)
    gaps = rng.exponential(1.0 / args.rate, int(args.rate * args.duration))
    latencies: list[float] = []
    failed, refused = [0], [0]
    futures = []

    def done(future, scheduled: float) -> None:
        error = future.exception()
        if error is None:
            latencies.append(time.perf_counter() - scheduled)
        elif error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            refused[0] += 1
        else:
            failed[0] += 1

    begin = time.perf_counter() + 0.1
    at = begin
    for i, gap in enumerate(gaps):
        at += gap
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        stub = stubs[i % len(stubs)]
        future = stub.Recommend.future(requests[i % len(requests)], timeout=30)
        scheduled = at
        future.add_done_callback(lambda f, s=scheduled: done(f, s))
        futures.append(future)
    for f in futures:
        f.exception()
    return latencies, refused[0], failed[0]


def stage_seconds(metrics_port: int) -> dict[str, tuple[float, float]]:
    """``{stage: (seconds summed, batches)}`` from the server's ``recserve_recommend_stage_seconds``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, slot in (("_sum{", 0), ("_count{", 1)):
            if line.startswith("recserve_recommend_stage_seconds" + part):
                stage = line.split('stage="', 1)[1].split('"', 1)[0]
                out.setdefault(stage, [0.0, 0.0])[slot] += float(line.rsplit(" ", 1)[1])
    return {stage: (total, count) for stage, (total, count) in out.items()}


def start_server(pipeline: Path, port: int, metrics_port: int, args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "recserve.cli", "serve", "--package", str(pipeline), "--port", str(port)]
    cmd += ["--metrics-port", str(metrics_port), "--admin-port", "-1", "--workers", str(args.workers)]
    # The loops measure queueing themselves: the server's shedding (a lagging queue, too many in flight)
    # would only hide it.
    cmd += ["--max-queue-lag-ms", "0", "--grpc-threads", "512", "--max-inflight", "512"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return wait_serving(subprocess.Popen(cmd, env=env), port, timeout_s=900)  # verifies every file first


def index_only(args: argparse.Namespace) -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(1000, DIM, generator=g)
    embeddings = centres[torch.randint(0, 1000, (args.items,), generator=g)] + 0.5 * torch.randn(
        args.items, DIM, generator=g
    )
    queries = torch.randn(256, DIM, generator=g)
    _, choice = build_index(embeddings, queries, recall_at=100)
    print(f"index {choice.type} {json.dumps(choice.params)} over {args.items} items")
    print(f"ann recall@100 {choice.recall:.4f}")
    print(f"index build cpu s {choice.build_cpu_seconds:.1f}")
    print(f"index build s {choice.build_seconds:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--connections", type=int, default=8, help="gRPC connections the calls are spread over"
    )
    parser.add_argument("--index-only", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the packages are built (a temporary folder)")
    args = parser.parse_args()
    print_machine()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    if args.index_only:
        index_only(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-recommend-", dir=args.workdir) as tmp:
        started = time.perf_counter()
        limits = Limits(
            num_candidates=args.candidates, max_candidates=max(4000, args.candidates), top_k=args.k
        )
        pipeline, export_s = build_pipeline(Path(tmp), args.items, limits)
        manifest = json.loads((pipeline / "manifest.json").read_text())
        index = manifest["index"]
        package_mb = sum(f.stat().st_size for f in pipeline.rglob("*") if f.is_file()) / 2**20
        print(f"setup s {time.perf_counter() - started:.1f} (stage packages, catalogue, pipeline)")
        print(f"pipeline export s {export_s:.1f}")
        print(f"index {index['type']} {json.dumps(index['params'])} over {args.items} items")
        print(f"pipeline package MB {package_mb:.0f}")
        # The ranking's dense part runs in bf16 where the CPU has it natively (AVX512-BF16, AMX), else fp32:
        # per 1,000 candidates 1.2 CPU ms (bf16, AVX512-BF16) against 4.0-4.4 (fp32, an AVX2 machine).
        ranking = json.loads((pipeline / "ranking" / "manifest.json").read_text())
        dtype, why = choose_dense_dtype(ranking["dense_dtype"], ranking.get("accuracy"), "cpu")
        print(f"ranking dense dtype {dtype} ({why})")
        port, metrics_port = free_port(), free_port()
        proc = start_server(pipeline, port, metrics_port, args)
        batch_candidates: list[int] = []
        try:
            stubs = connect(port, args.connections)
            workers = worker_pids(proc.pid)
            before, cpu_before = stage_seconds(metrics_port), [process_cpu_s(p) for p in workers]
            capacity = closed_loop(stubs, args, batch_candidates)
            after, cpu_after = stage_seconds(metrics_port), [process_cpu_s(p) for p in workers]
            print(f"recommend capacity rps {capacity:.1f}", flush=True)
            steady = worker_memory(proc.pid)  # after the closed loop: a worker's steady serving state
            answered, refused, failed = open_loop(stubs, args)
            latencies = np.array(answered or [float("nan")]) * 1e3  # nan: every request refused
            memory = worker_memory(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(300)
    print(f"load average {os.getloadavg()[0]:.1f} after the loops")
    batches = after.get("ranking", (0, 0))[1] - before.get("ranking", (0, 0))[1]
    print(f"closed loop: requests per batch {np.mean(batch_candidates) / args.candidates:.2f}")
    for stage, (total, _) in after.items():
        per_batch = (total - before.get(stage, (0, 0))[0]) / max(batches, 1)
        print(f"closed loop: {stage} ms per batch {per_batch * 1e3:.2f}")
    for i, (a, b) in enumerate(zip(cpu_before, cpu_after)):
        print(f"worker {i} cpu s in the closed loop (warm-up included) {b - a:.1f}")
    for i, m in enumerate(steady):
        print(f"worker {i} after the closed loop: private_dirty MB {m['Private_Dirty'] / 1024:.0f}")
    for i, m in enumerate(memory):
        print(
            f"worker {i} MB: rss {m['Rss'] / 1024:.0f}, pss {m['Pss'] / 1024:.0f}, "
            f"private_dirty {m['Private_Dirty'] / 1024:.0f}, anonymous {m['Anonymous'] / 1024:.0f}"
        )
    # Anonymous pages are (nearly all) private dirty ones too: the larger of the two, not their sum.
    private = max(max(m["Private_Dirty"], m["Anonymous"]) / 1024 for m in memory)
    print(f"items {args.items}")
    print(f"candidates per request {args.candidates}")
    print(f"recommend p50 ms at {args.rate:g} rps {np.percentile(latencies, 50):.2f}")
    print(f"recommend capacity rps {capacity:.1f}")
    print(f"recommend open loop requests refused (admission) {refused}")
    print(f"recommend open loop requests failed {failed}")
    print(f"ann recall@100 {index['recall']['value']:.4f}")
    print(f"index build cpu s {index.get('build_cpu_seconds', 0):.1f}")
    print(f"index build s {index['build_seconds']:.2f}")
    print(f"worker private MB {private:.0f}")
    print(f"recommend p99 ms at {args.rate:g} rps {np.percentile(latencies, 99):.2f}")


if __name__ == "__main__":
    main()
