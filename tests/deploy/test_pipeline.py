"""The Kubernetes workloads' own command lines, run on this machine with their volumes as local directories:
train (the Job's run config, shortened) -> export version 1 -> serve with the Deployment's flags (health
check, predictions equal to the in-process Predictor, metrics the dashboards use) -> export version 2, which
the server swaps in under load without a failed request -> SIGTERM exits 0."""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import tomllib
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy import promql
from tests.deploy.manifests import (
    DEPLOY,
    container_argv,
    k8s_object,
    localize,
    pod_spec,
    read_command,
    with_env,
)
from tests.deploy.test_monitoring import _dashboard_queries, alert_rules

pytestmark = pytest.mark.slow

RECSERVE = [sys.executable, "-c", "import sys; from recserve.cli import main; sys.exit(main())"]
SHORT_RUN = ["train.steps=2", "train.batch_size=64", "train.eval_batches=1", "checkpoint.every_n_steps=1"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _workload(kind: str, name: str, root: Path, **env: str) -> list[str]:
    workload = k8s_object(kind, name)
    (container,) = pod_spec(workload)["containers"]
    container = with_env(container, **env) if env else container
    argv = container_argv(container, f"{kind}/{name}")
    return localize(argv, pod_spec(workload), container, root)


def _run(main: Callable[[list[str]], int], argv: list[str]) -> None:
    """A Job's command by its CLI's entry point (what the image's ``rectrain`` / ``recserve`` run) in this
    process: a new interpreter per Job would only add torch's import. The server keeps its own processes."""
    code = main(argv)
    assert code == 0, f"{argv} exited {code}"


def _train(root: Path) -> None:
    """The training Job's command in one process (no torchrun), shortened, its paths on local volumes."""
    from rectrain.cli import main

    job = k8s_object("Job", "rectrain-train")
    (container,) = pod_spec(job)["containers"]
    argv = _workload("Job", "rectrain-train", root)
    inner = list(read_command(argv, "train Job").launcher.training_script_args)
    run_config = tomllib.loads(Path(inner[inner.index("--config") + 1]).read_text())
    paths = [run_config["checkpoint"]["dir"], run_config["train"]["metrics_log"]]
    checkpoints, metrics_log = localize(paths, pod_spec(job), container, root)
    overrides = [*SHORT_RUN, f"checkpoint.dir={checkpoints}", f"train.metrics_log={metrics_log}"]
    _run(main, [*inner, *[a for o in overrides for a in ("--set", o)]])
    assert (Path(checkpoints) / "latest").is_file()


def _export(root: Path, version: str) -> Path:
    from recserve.cli import main

    argv = _workload("Job", "recserve-export", root, MODEL_VERSION=version)
    _run(main, argv[1:])
    package = Path(argv[argv.index("--out") + 1])
    assert (package / "manifest.json").is_file() and package.name == version
    return package


@contextlib.contextmanager
def _server(root: Path) -> Iterator[tuple[subprocess.Popen, str, int]]:
    argv = _workload("Deployment", "recserve", root)[1:]
    port, metrics_port, admin_port = _free_port(), _free_port(), _free_port()
    flags = (
        ("--port", port),
        ("--metrics-port", metrics_port),
        ("--host", "127.0.0.1"),
        ("--admin-port", admin_port),
    )
    for flag, value in flags:
        argv[argv.index(flag) + 1] = str(value)
    argv[argv.index("--metrics-host") + 1] = "127.0.0.1"
    process = subprocess.Popen(
        [*RECSERVE, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process, f"127.0.0.1:{port}", metrics_port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _healthcheck():
    spec = importlib.util.spec_from_file_location("healthcheck", DEPLOY / "docker" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wait_serving(process: subprocess.Popen, target: str, timeout: float = 120.0) -> None:
    check, deadline = _healthcheck().check, time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"server exited {process.returncode}: {process.stderr.read()[-3000:]}"
        serving, message = check(target, "recserve.v1.Predictor", 1.0)
        if serving:
            return
        time.sleep(0.5)
    raise AssertionError(f"server not SERVING after {timeout} s: {message}")


def _request(metadata, batch: int = 8) -> tuple[torch.Tensor, object]:
    from recserve.client import kjt_from_lists

    g = torch.Generator().manual_seed(0)
    sparse = {
        f.name: [torch.randint(0, f.num_embeddings, (3,), generator=g).tolist() for _ in range(batch)]
        for f in metadata.features
    }
    return torch.randn(batch, metadata.dense_in_features, generator=g), kjt_from_lists(sparse)


def _scrape(port: int) -> dict[str, list]:
    """Sample name -> samples of the server's /metrics page, parsed by prometheus_client's parser."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _served_versions(port: int) -> set[str]:
    """The versions some worker serves, by the summed ``recserve_model_info`` of the /metrics page."""
    return {s.labels["version"] for s in _scrape(port).get("recserve_model_info", []) if s.value > 0}


def _predict_until(client, dense, kjt, stop: threading.Event, failures: list, counts: list) -> None:
    while not stop.is_set():
        try:
            client.predict(dense, kjt, timeout=30)
            counts.append(1)
        except grpc.RpcError as e:
            # Shedding on a crowded machine is the server's answer to overload, not a request lost to the
            # roll: back off and retry, as the message asks; anything else is a failure.
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                failures.append(e)
            time.sleep(0.05)
        except Exception as e:  # every failure is reported by the test
            failures.append(e)


def test_workloads_train_export_serve_and_roll_to_a_new_version(tmp_path: Path):
    from recserve.client import PredictorClient
    from recserve.runtime import Predictor

    _train(tmp_path)
    first = _export(tmp_path, "1")
    with _server(tmp_path) as (process, target, metrics_port), PredictorClient(target) as client:
        _wait_serving(process, target)
        metadata = client.metadata()
        assert (metadata.model_name, metadata.version) == ("dlrm", "1")
        dense, kjt = _request(metadata)
        expected = Predictor.load(first).predict(dense, kjt)
        torch.testing.assert_close(client.predict(dense, kjt), expected, rtol=1e-5, atol=1e-6)

        stop, failures, counts = threading.Event(), [], []
        load = threading.Thread(target=_predict_until, args=(client, dense, kjt, stop, failures, counts))
        load.start()
        try:
            _export(tmp_path, "2")
            # Each worker watches and swaps on its own: the roll is over when every one serves version 2.
            deadline = time.monotonic() + 90
            while _served_versions(metrics_port) != {"2"} and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stop.set()
            load.join()
        assert _served_versions(metrics_port) == {"2"}, "the watching workers did not all swap in version 2"
        assert client.metadata().version == "2"
        assert not failures and counts, f"{len(failures)} failed requests while rolling: {failures[:3]}"

        scraped = _scrape(metrics_port)
        used = {s.metric for _, expr in _dashboard_queries() for s in promql.parse(expr).selectors}
        used |= {s.metric for rule in alert_rules() for s in promql.parse(rule["expr"]).selectors} - {"up"}
        assert used <= scraped.keys(), f"not on the live /metrics page: {sorted(used - scraped.keys())}"
        served = {s.labels["version"]: s.value for s in scraped["recserve_model_info"]}
        assert served["2"] == 1 and served.get("1", 0) == 0

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=45) == 0, process.stderr.read()[-3000:]
