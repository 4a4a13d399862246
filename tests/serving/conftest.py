"""Serving fixtures: small real int8 packages exported from real models, and real servers on free ports."""

from __future__ import annotations

import contextlib
import shutil
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from recserve.export import export_package
from recserve.server.operations.app import RecServer
from recserve.server.operations.config import ServeConfig
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

FEATURES = ["f0", "f1", "f2"]
ROWS = [100, 150, 200]
DENSE = 4


def model_config() -> ModelConfig:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=8, feature_names=[f])
        for i, (f, n) in enumerate(zip(FEATURES, ROWS))
    ]
    return ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=DENSE, dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    )  # fmt: skip


def make_package(out: Path, version: str, seed: int) -> Path:
    cfg = model_config()
    torch.manual_seed(seed)
    model = build_model(cfg)
    return export_package(
        out, model_config=cfg, state_dict=model.state_dict(), model_name="tiny", version=version
    )


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> dict[str, Path]:
    """Version "1" and "2" of the same small DLRM, with different weights."""
    root = tmp_path_factory.mktemp("packages")
    return {v: make_package(root / v, v, seed=int(v)) for v in ("1", "2")}


@pytest.fixture
def package(packages) -> Path:
    return packages["1"]


def random_batch(batch: int, seed: int = 0, max_ids: int = 5) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_ids, (len(FEATURES) * batch,), generator=g)
    parts = []
    for i, n in enumerate(ROWS):
        count = int(lengths[i * batch : (i + 1) * batch].sum())
        parts.append(torch.randint(0, n, (count,), generator=g))
    kjt = KeyedJaggedTensor(keys=FEATURES, values=torch.cat(parts), lengths=lengths)
    return torch.randn(batch, DENSE, generator=g), kjt


@contextlib.contextmanager
def running_server(package: Path | None, **overrides):
    """A real server in this process on a free loopback port (metrics and admin on other free ports)."""
    ports = {"port": 0, "metrics_port": 0, "admin_port": 0, "http_port": 0}
    # Lag-based shedding (default 100 ms) refuses calls whenever this process is starved for a moment,
    # as it is beside parallel tests; tests of shedding pass their own limit or run the server's defaults.
    # Recommend's admission likewise (its pace is measured in wall time).
    relaxed = {"max_queue_lag_ms": 5000.0, "max_recommend_queued_ms": 5000.0}
    cfg = ServeConfig(package=package, **{**ports, **relaxed, **overrides})
    server = RecServer(cfg)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def target(server: RecServer) -> str:
    return f"127.0.0.1:{server.port}"


def admin_target(server: RecServer) -> str:
    return f"127.0.0.1:{server.admin_port}"


def scrape(server: RecServer) -> dict[str, dict]:
    """``{sample name: {labels: value}}`` from the server's /metrics page, parsed by prometheus_client."""
    port = server._metrics_http.server_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return parse_metrics(text)


def counts_in(metrics: dict, method: str) -> dict[str, float]:
    """``recserve_requests_total`` of ``method`` by status code, from scraped metrics."""
    samples = metrics.get("recserve_requests_total", {})
    return {dict(k)["code"]: v for k, v in samples.items() if dict(k)["method"] == method}


def request_counts(server: RecServer, method: str) -> dict[str, float]:
    """``recserve_requests_total`` of ``method`` by status code, scraped from ``server`` now."""
    return counts_in(scrape(server), method)


def wait_for(condition, seconds: float, interval: float = 0.05) -> bool:
    """Polls ``condition`` for up to ``seconds``; its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def parse_metrics(text: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_package(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
