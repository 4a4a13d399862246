"""Overload: N calls fired at once at ``recserve serve`` with default flags; outcomes, latency and counting.

Exports a small DLRM (3 tables) to a temp package, starts ``recserve serve`` (one worker, default flags: the
admission limit is 7/8 of the 64 handler threads), fires ``--calls`` Predict calls as futures over
``--channels`` connections from this process, and prints the outcome histogram with each outcome's latency
(from sending the call to its end) and the server's ``recserve_requests_total`` for Predict, which must add
up to the calls sent. ``--target HOST:PORT --metrics URL`` probes a running server instead.

    .venv/bin/python bench/overload_burst.py [--calls 5000] [--channels 8] [--batch 4] [--timeout 10]

Goal (issue 17): every call ends OK or RESOURCE_EXHAUSTED within 1 s of being sent; counts add up.
The last line is ``recserve burst calls <N> ok <K> exhausted <E> other <O> max_s <M> counted <C>``.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
from prometheus_client.parser import text_string_to_metric_families

from recserve.client import PredictorClient
from recserve.client.burst import fire_burst
from recserve.export import export_package
from recserve.server.transports.codec import encode_predict_request
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

ROWS = (1000, 1500, 2000)
DENSE = 13


def cpu_description() -> str:
    model, flags = platform.processor() or "unknown CPU", "unknown ISA"
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            have = set(value.split())
            flags = (
                " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in have) or "no avx2"
            )
            break
    return f"{model} ({os.cpu_count()} cores; {flags})"


def export_small(out: Path) -> Path:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=16, feature_names=[f"f{i}"])
        for i, n in enumerate(ROWS)
    ]
    cfg = ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=DENSE, dense_arch_layer_sizes=[64, 16],
        over_arch_layer_sizes=[64, 1],
    )  # fmt: skip
    torch.manual_seed(0)
    return export_package(out, model_config=cfg, state_dict=build_model(cfg).state_dict(), model_name="burst")


def request_bytes(batch: int) -> bytes:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 4, (len(ROWS) * batch,), generator=g)
    counts = lengths.view(len(ROWS), batch).sum(1).tolist()
    values = torch.cat([torch.randint(0, n, (c,), generator=g) for n, c in zip(ROWS, counts)])
    kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(ROWS))], values=values, lengths=lengths)
    return encode_predict_request(torch.randn(batch, DENSE, generator=g), kjt).SerializeToString()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(package: Path) -> tuple[subprocess.Popen, str, str]:
    port, metrics_port, admin_port = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "recserve.cli", "serve", "--package", str(package), "--port", str(port)]
    cmd += ["--metrics-port", str(metrics_port), "--admin-port", str(admin_port)]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONWARNINGS="ignore"), stderr=subprocess.DEVNULL)
    client = PredictorClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if client.health(timeout=1) == "SERVING":
                return proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
        except Exception:  # not listening yet
            time.sleep(0.3)
    proc.kill()
    raise TimeoutError("server did not start")


def predict_counts(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "recserve_requests_total" and s.labels["method"].endswith("Predictor/Predict"):
                counts[s.labels["code"]] = s.value
    return counts


def probe(target: str, metrics_url: str, args: argparse.Namespace) -> None:
    before = sum(predict_counts(metrics_url).values())
    result = fire_burst(
        target, request_bytes(args.batch), calls=args.calls, channels=args.channels, timeout=args.timeout
    )
    time.sleep(0.5)  # a refusal is counted as it is sent; let the last ones land
    counts = predict_counts(metrics_url)
    counted = sum(counts.values()) - before
    print(result.summary())
    print(f"server recserve_requests_total{{method=Predict}}: {counts} (+{counted:.0f} in this burst)")
    h = result.histogram()
    other = args.calls - h["OK"] - h["RESOURCE_EXHAUSTED"]
    worst = result.percentile(1.0)
    goal = "met" if other == 0 and worst <= 1.0 and counted == args.calls else "NOT met"
    print(f"every call OK or RESOURCE_EXHAUSTED within 1 s, counted once: goal {goal}")
    print(
        f"recserve burst calls {args.calls} ok {h['OK']} exhausted {h['RESOURCE_EXHAUSTED']} other {other} "
        f"max_s {worst:.3f} counted {counted:.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--channels", type=int, default=8, help="client connections the calls are spread over")
    ap.add_argument("--batch", type=int, default=4, help="examples per call")
    ap.add_argument("--timeout", type=float, default=10.0, help="each call's deadline (s)")
    ap.add_argument("--target", help="probe this running server instead of starting one")
    ap.add_argument("--metrics", help="its /metrics URL (with --target)")
    args = ap.parse_args()
    print(f"CPU: {cpu_description()}; python {platform.python_version()}")
    if args.target:
        probe(args.target, args.metrics, args)
        return
    with tempfile.TemporaryDirectory(prefix="recserve-burst-") as tmp:
        proc, target, metrics_url = start_server(export_small(Path(tmp) / "pkg"))
        try:
            probe(target, metrics_url, args)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
