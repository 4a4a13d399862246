"""The predictor next to busy Python threads: its TorchScript graph vs the eager model, as a server runs it.

In a server the batch thread shares its process with handler threads that run Python. Eager PyTorch takes
the GIL back after every op, so there the batch thread queues for it ~100 times per batch; the graph
(``Predictor.graph``, recserve/runtime/serving_graph.py) takes it once. This times ``predict`` on the standard
workload (WORKLOAD.md, int8 tables) at one torch thread, alone and next to N threads that each run ~50 us of
Python every 2 ms (a handler's decode and reply), with the graph and with the eager model
(``predictor.graph = None``), and prints the ratio.

    .venv/bin/python bench/predict_under_gil.py [--threads 0,8,16] [--batches 64,512]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import torch
from machine import print_machine
from serve_throughput import DENSE, E, L, T, export_standard

from recserve.runtime import Predictor
from rectrain.sparse import KeyedJaggedTensor


def batch_of(size: int) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(size)
    lengths = torch.randint(1, 2 * L, (T * size,), generator=g)
    values = torch.randint(0, E, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(T)], values=values, lengths=lengths)
    return torch.randn(size, DENSE, generator=g), kjt


def handler_like(stop: threading.Event) -> None:
    while not stop.is_set():
        reply = {}
        for i in range(300):  # ~50 us of Python, holding the GIL
            reply[i] = str(i)
        time.sleep(0.002)


def ms_per_call(predictor: Predictor, dense: torch.Tensor, kjt: KeyedJaggedTensor, calls: int) -> float:
    """The median of 5 windows, in ms per ``predict``."""
    for _ in range(3):
        predictor.predict(dense, kjt, checked=True)
    windows = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            predictor.predict(dense, kjt, checked=True)
        windows.append((time.perf_counter() - start) / calls * 1e3)
    return sorted(windows)[2]


def main() -> None:
    print_machine()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="0,8,16", help="busy Python threads beside the predicting one")
    ap.add_argument("--batches", default="64,512")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as each server worker runs on a machine with one core per worker
    with tempfile.TemporaryDirectory(prefix="recserve-bench-") as tmp:
        predictor = Predictor.load(export_standard(Path(tmp) / "pkg"))
    graph = predictor.graph
    if graph is None:
        raise SystemExit("the standard model's graph could not be built; see the log")
    print(f"graph built (lookups inside it: {graph.fused})")
    for count in (int(x) for x in args.threads.split(",")):
        stop = threading.Event()
        busy = [threading.Thread(target=handler_like, args=(stop,), daemon=True) for _ in range(count)]
        for thread in busy:
            thread.start()
        try:
            for size in (int(x) for x in args.batches.split(",")):
                dense, kjt = batch_of(size)
                calls = max(10, 4096 // size)
                predictor.graph = None
                eager = ms_per_call(predictor, dense, kjt, calls)
                predictor.graph = graph
                traced = ms_per_call(predictor, dense, kjt, calls)
                print(
                    f"{count:>2} busy threads, batch {size:>4}: eager {eager:6.2f} ms, "
                    f"graph {traced:6.2f} ms per predict; eager/graph {eager / traced:.2f}x"
                )
        finally:
            stop.set()
            for thread in busy:
                thread.join()


if __name__ == "__main__":
    main()
