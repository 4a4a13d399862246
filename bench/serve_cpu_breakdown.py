"""Where the served workload's CPU goes: CPU ms per request in the server and in the load generator.

Wall-clock latencies on a shared 2-core machine mostly measure the neighbours; CPU time per request does not.
This script (standard workload, same package as ``serve_throughput.py``):

1. times ``ModelRunner._predict_batch`` (merge + predict + split) in process, one torch thread (as each of
   2 workers on 2 cores runs), at merged batches of 64 .. 512 examples: CPU ms per 64 examples;
2. starts ``recserve serve`` and, for a closed loop and each open-loop rate, reports the server's CPU ms per
   request (all its processes and threads, from /proc) and the load generator's (its reaped processes).

    .venv/bin/python bench/serve_cpu_breakdown.py [--workers 2] [--rates 150,250] [--duration 6]

Capacity on C cores is at most C / (server + load generator CPU per request).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import print_machine
from serve_throughput import export_standard, free_port, start_server

from recserve.client.loadgen import LoadgenConfig, build_requests, requests_for, run_loadgen
from recserve.client.openloop import OpenLoopConfig, run_open_loop

_TICK = os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its direct children (the server's workers)."""
    pids = [pid] + [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    total = 0.0
    for p in pids:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def predict_cpu_per_64(package: Path, batches: tuple[int, ...] = (1, 2, 4, 8)) -> dict[int, float]:
    """CPU ms per 64 examples of one batch of ``k`` merged 64-example requests, one torch thread."""
    from recserve.client.client import ServedModel, SparseFeatureInfo
    from recserve.runtime import Predictor
    from recserve.server.batcher import BatcherConfig
    from recserve.server.codec import decode_predict_request
    from recserve.server.protos import pb2
    from recserve.server.runner import ModelRunner
    from recserve.server.validation import check_request

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runner = ModelRunner(Predictor.load(package), BatcherConfig(), package_dir=package)
    try:
        s = runner.schema
        features = [
            SparseFeatureInfo(n, int(e), False, "") for n, e in zip(s.feature_names, s.num_embeddings)
        ]
        model = ServedModel(s.model_name, s.version, s.dense_in_features, features, s.max_batch_size)
        checked = [
            check_request(decode_predict_request(pb2.PredictRequest.FromString(r)), s)
            for r in build_requests(model, 64, max(batches), 20, 0)
        ]
        out = {}
        for k in batches:
            for _ in range(3):
                runner._predict_batch(checked[:k], record=False)
            start, n = time.process_time(), max(8, 64 // k)
            for _ in range(n):
                runner._predict_batch(checked[:k], record=False)
            out[64 * k] = (time.process_time() - start) / n / k * 1e3
        return out
    finally:
        runner.close()
        torch.set_num_threads(threads)


def main() -> None:
    print_machine()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--max-batch-size", type=int, default=512)
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--rates", default="150,250", help="open-loop request rates (requests/s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="recserve-bench-") as tmp:
        package = export_standard(Path(tmp) / "pkg")
        for examples, ms in predict_cpu_per_64(package).items():
            print(f"in process, 1 torch thread, batch {examples}: {ms:.2f} CPU ms per 64 examples")
        port = free_port()
        proc = start_server(package, port, args)
        try:
            target = f"127.0.0.1:{port}"
            cfg = LoadgenConfig(target, args.concurrency, args.duration, 64, warmup_s=0.0)
            requests = requests_for(cfg)
            runs = [None] + [float(r) for r in args.rates.split(",") if r]
            for rate in runs:
                server0 = process_tree_cpu_s(proc.pid)
                client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if rate is None:
                    result = run_loadgen(cfg, requests)
                else:
                    result = run_open_loop(
                        OpenLoopConfig(target, rate, args.duration, warmup_s=0.0), requests
                    )
                server = process_tree_cpu_s(proc.pid) - server0
                client1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                client = client1.ru_utime + client1.ru_stime - client0.ru_utime - client0.ru_stime
                n = max(1, result.latencies_s.size)
                print(f"{'closed loop' if rate is None else f'open loop {rate:.0f}/s'}: {result.summary()}")
                print(
                    f"  CPU ms per request: server {server / n * 1e3:.2f} "
                    f"({server / args.duration:.2f} cores), "
                    f"load generator {client / n * 1e3:.2f} (includes its processes' start-up)"
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    sys.exit(main())
