"""The load generator's caller processes: light to start, and a start instant callers can time from."""

from __future__ import annotations

import subprocess
import sys
import time

from recserve.client.loadgen import fan_out


def test_caller_processes_import_neither_torch_nor_grpc_up_front():
    # Each caller process imports recserve.client.loadgen; torch there is CPU spent beside the server.
    code = (
        "import sys, recserve.client.loadgen; "
        "print('torch' in sys.modules, 'grpc' in sys.modules); "
        "from recserve.client import PredictorClient, AdminClient; print(PredictorClient.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "PredictorClient"]


def _caller(started, ready, go, results) -> None:
    ready.set()
    go.wait()
    results.put(([time.perf_counter() - started.value], {}))


def test_fan_out_reports_the_instant_every_process_starts_from():
    import multiprocessing

    started = multiprocessing.get_context("spawn").Value("d", 0.0)
    seen: list[float] = []

    def on_go(t0: float) -> None:
        seen.append(t0)
        started.value = t0

    before = time.perf_counter()
    latencies, errors = fan_out(_caller, [(started,)], wait_s=60, on_go=on_go)
    assert len(seen) == 1 and before < seen[0] <= time.perf_counter()
    assert errors == {} and latencies.size == 1
    # perf_counter is one clock across processes: the caller read it after the start instant.
    assert 0 <= latencies[0] < 30
