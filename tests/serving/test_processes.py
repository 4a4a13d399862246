"""`recserve serve` as its own process: SIGTERM drain, workers on one port, TLS, `query`, `loadgen`."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from recserve.cli import main as recserve_main
from recserve.client import AdminClient, PredictorClient
from recserve.client.loadgen import LoadgenConfig, run_loadgen
from recserve.server.operations.workers import cpu_groups
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc

from .conftest import copy_package, free_port, parse_metrics, random_batch
from .test_oip import infer_request

CLI = [sys.executable, "-m", "recserve.cli"]


def start_serve(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if "--admin-port" not in args:
        args = (*args, "--admin-port", "-1")  # the default 50052 may be taken on a shared machine
    return subprocess.Popen(
        [*CLI, "serve", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_serving(client: PredictorClient, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if client.health(timeout=1) == "SERVING":
                return
        except grpc.RpcError:
            time.sleep(0.2)
    raise TimeoutError("server did not become ready")


@pytest.mark.slow
def test_sigterm_drains_queued_requests_and_exits_zero(package):
    port = free_port()
    # One worker: with two, health may answer from one while the other still loads the package, and a
    # SIGTERM then stops that one before it serves (its exit is not the drain this test is about).
    proc = start_serve(
        "--package", str(package), "--port", str(port), "--metrics-port", "-1", "--max-queue-delay-ms", "500",
        "--workers", "1",
    )  # fmt: skip
    client = PredictorClient(f"127.0.0.1:{port}")
    try:
        wait_serving(client, proc)
        results, errors = [], []

        def call():
            try:
                results.append(client.predict(*random_batch(2), timeout=20))
            except grpc.RpcError as e:
                errors.append(e)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)  # the requests wait in the batcher (delay 500 ms)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert errors == [] and len(results) == 4
    assert "drained and stopped" in proc.stdout.read()


def test_workers_get_equal_contiguous_groups_of_the_cpus():
    assert cpu_groups([1, 0], 2) == [[0], [1]]
    assert cpu_groups(range(16), 2) == [list(range(8)), list(range(8, 16))]
    assert cpu_groups([0, 2, 4, 6, 8], 2) == [[0, 2, 4], [6, 8]]  # a cpuset with gaps; the first one larger
    assert cpu_groups([3], 2) is None  # fewer CPUs than workers: left to the kernel


@pytest.mark.slow
def test_two_workers_share_one_port_and_one_metrics_page(package):
    port, metrics_port = free_port(), free_port()
    proc = start_serve(
        "--package", str(package), "--port", str(port), "--metrics-port", str(metrics_port), "--workers", "2"
    )
    try:
        clients = [PredictorClient(f"127.0.0.1:{port}") for _ in range(6)]  # a channel per client: spread
        wait_serving(clients[0], proc)
        for c in clients:
            c.wait_ready(60)
            assert c.predict(*random_batch(3)).shape == (3,)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        metrics = parse_metrics(text)
        ok = (("code", "OK"), ("method", "recserve.v1.Predictor/Predict"))
        assert metrics["recserve_requests_total"][ok] == 6  # summed over both workers
        assert metrics["recserve_model_info"][(("model", "tiny"), ("version", "1"))] == 1
        # Each worker keeps its own share of the CPUs this process may use (2 workers on 1 CPU: not pinned).
        groups = cpu_groups(sorted(os.sched_getaffinity(0)), 2)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2
        pinned = sorted(sorted(os.sched_getaffinity(pid)) for pid in workers)
        assert pinned == (groups or [sorted(os.sched_getaffinity(0))] * 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stdout.read().count("drained and stopped") == 2


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # exited, not yet reaped by its new parent


@pytest.mark.slow
def test_workers_stop_when_the_parent_is_killed(package):
    port = free_port()
    proc = start_serve(
        "--package", str(package), "--port", str(port), "--metrics-port", "-1", "--workers", "2"
    )
    try:
        wait_serving(PredictorClient(f"127.0.0.1:{port}"), proc)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2
    finally:
        proc.kill()  # SIGKILL: the parent cannot pass the stop on
        proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_gone(w) for w in workers):
        time.sleep(0.2)
    assert all(_gone(w) for w in workers), "orphaned workers still running"


@pytest.mark.slow
def test_model_calls_and_statistics_reach_every_worker_whichever_one_gets_the_call(packages, tmp_path):
    """With 2 workers, admin reload and Triton's repository unload/load change the model of both before
    they answer: no connection goes on being served the old model (or none) by the worker the call missed.
    Statistics (gRPC and REST) count the requests of both."""
    repo = tmp_path / "tiny"
    copy_package(packages["1"], repo / "1")
    port, metrics_port, admin_port, http_port = free_port(), free_port(), free_port(), free_port()
    proc = start_serve(
        "--package", str(repo / "1"), "--port", str(port), "--metrics-port", str(metrics_port),
        "--workers", "2", "--admin-port", str(admin_port), "--http-port", str(http_port),
        "--model-control", "explicit", "--admin-token", "s3cret",
    )  # fmt: skip
    auth = (("authorization", "Bearer s3cret"),)
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(8)]  # spread over the workers
    stubs = [oip_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    request = infer_request(*random_batch(2, seed=3), raw=True)

    def served() -> dict[str, float]:  # version -> max over the live workers of recserve_model_info
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        return {dict(k)["version"]: v for k, v in parse_metrics(text).get("recserve_model_info", {}).items()}

    def versions_answered() -> set[str]:
        answers = set()
        for stub in stubs:
            try:
                answers.add(stub.ModelInfer(request, timeout=30).model_version)
            except grpc.RpcError as e:
                answers.add(e.code().name)
        return answers

    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while sum("serving tiny 1 on" in line for line in list(lines)) < 2:  # both workers listen
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        assert versions_answered() == {"1"}
        copy_package(packages["2"], repo / "2")
        admin = AdminClient(f"127.0.0.1:{admin_port}", token="s3cret")
        assert admin.reload("2", timeout=120) == ("tiny", "2", True)
        assert served() == {"1": 0, "2": 1}  # both workers swapped before the call returned
        assert versions_answered() == {"2"}

        unload = oip_pb2.RepositoryModelUnloadRequest(model_name="tiny")
        stubs[0].RepositoryModelUnload(unload, timeout=120, metadata=auth)
        assert served() == {"1": 0, "2": 0}
        assert versions_answered() == {"UNAVAILABLE"}
        load = oip_pb2.RepositoryModelLoadRequest(model_name="tiny")
        stubs[-1].RepositoryModelLoad(load, timeout=120, metadata=auth)
        assert served() == {"1": 0, "2": 1}
        assert versions_answered() == {"2"}

        with pytest.raises(grpc.RpcError) as info:  # fails in every worker: the first one's error, named
            admin.reload("3", timeout=120)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = info.value.details()
        assert details.startswith("worker 0: ") and "still serving tiny 2" in details
        assert versions_answered() == {"2"}

        # Version 2 as loaded last has served 2 x 8 requests of 2 examples, over both workers.
        stats = stubs[3].ModelStatistics(oip_pb2.ModelStatisticsRequest(name="tiny")).model_stats
        assert [(s.version, s.inference_count, s.inference_stats.success.count) for s in stats] == [
            ("2", 32, 16)
        ]
        assert sum(b.batch_size * b.compute_infer.count for b in stats[0].batch_stats) == 32
        rest = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/tiny/stats", timeout=30).read()
        )["model_stats"]
        assert [(s["version"], int(s["inference_count"])) for s in rest] == [("2", 32)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        for c in channels:
            c.close()
        if proc.poll() is None:
            proc.kill()


def _make_certs(d: Path) -> dict[str, Path]:
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            "/CN=localhost",
        )
        (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext")  # fmt: skip
    return {n: d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.slow
def test_mutual_tls_and_the_query_command(package, tmp_path, capsys):
    from .conftest import running_server

    c = _make_certs(tmp_path)
    tls = dict(tls_cert=c["server.pem"], tls_key=c["server.key"], tls_client_ca=c["ca.pem"])
    with running_server(package, **tls) as server:
        addr = f"localhost:{server.port}"
        secure = PredictorClient(
            addr, root_certificates=c["ca.pem"], client_key=c["client.key"], client_cert=c["client.pem"]
        )
        assert secure.predict(*random_batch(2)).shape == (2,)
        with pytest.raises(grpc.RpcError):  # no client certificate: refused
            PredictorClient(addr, root_certificates=c["ca.pem"], timeout=5).predict(*random_batch(2))
        example = tmp_path / "ex.json"
        example.write_text(
            json.dumps({"dense": [[0.1, 0.2, 0.3, 0.4]], "sparse": {"f0": [[1, 2]], "f1": [[3]], "f2": [[]]}})
        )
        tls_args = [
            "--tls-ca",
            str(c["ca.pem"]),
            "--tls-cert",
            str(c["client.pem"]),
            "--tls-key",
            str(c["client.key"]),
        ]
        # The query command by its entry point in this process: a new interpreter only adds torch's import.
        capsys.readouterr()
        code = recserve_main(["query", "--target", addr, "--input", str(example), *tls_args])
        out = capsys.readouterr()
        assert code == 0, out.err
        reply = json.loads(out.out)
        expected = secure.predict_lists([[0.1, 0.2, 0.3, 0.4]], {"f0": [[1, 2]], "f1": [[3]], "f2": [[]]})
        assert reply["model_version"] == "1" and reply["scores"] == pytest.approx(expected)


@pytest.mark.slow
def test_loadgen_reports_throughput_latency_and_errors(package):
    from .conftest import running_server

    with running_server(package, max_queue_delay_ms=1) as server:
        r = run_loadgen(
            LoadgenConfig(
                f"127.0.0.1:{server.port}",
                concurrency=4,
                duration_s=1.0,
                request_batch=8,
                processes=1,
                warmup_s=0.2,
            )
        )
    assert r.errors == {} and r.requests > 10
    assert 0 < r.percentile_ms(50) <= r.percentile_ms(99) <= r.percentile_ms(100)
    assert r.examples_per_s == pytest.approx(r.requests * 8 / 1.0)
    assert "p99" in r.summary()


def test_loadgen_callers_are_independent_connections():
    """Each caller has its own TCP connection, so SO_REUSEPORT workers (which get connections) share load."""
    from concurrent import futures

    peers: set[str] = set()

    def predict(request: bytes, context: grpc.ServicerContext) -> bytes:
        peers.add(context.peer())  # "ipv4:127.0.0.1:<client port>": one per connection
        return b""

    handler = grpc.method_handlers_generic_handler(
        "recserve.v1.Predictor", {"Predict": grpc.unary_unary_rpc_method_handler(predict)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        cfg = LoadgenConfig(f"127.0.0.1:{port}", concurrency=4, duration_s=0.5, processes=1, warmup_s=0.1)
        r = run_loadgen(cfg, requests=[b""])
    finally:
        server.stop(None)
    assert r.errors == {} and r.requests > 0
    assert len(peers) == 4


@pytest.mark.slow
def test_open_loop_offers_poisson_arrivals_and_measures_from_the_scheduled_time(package):
    """About rate x duration requests arrive whatever the replies do; latencies count from the arrival."""
    from recserve.client.openloop import OpenLoopConfig, run_open_loop

    from .conftest import running_server

    with running_server(package, max_queue_delay_ms=1) as server:
        cfg = OpenLoopConfig(
            f"127.0.0.1:{server.port}", rate_rps=60, duration_s=2.0, warmup_s=0.3, request_batch=8,
            processes=1, channels=4,
        )  # fmt: skip
        r = run_open_loop(cfg)
    # Poisson count over 2 s at 60/s: mean 120, sd 11; a loaded machine may drop a few to errors, none here
    assert r.errors == {} and 60 <= r.latencies_s.size <= 200
    assert 0 < r.percentile_ms(50) <= r.percentile_ms(99) <= r.percentile_ms(100)
    assert r.examples_per_s == pytest.approx(r.latencies_s.size * 8 / 2.0)
    assert "Poisson 60 requests/s" in r.summary()


@pytest.mark.slow
def test_open_loop_splits_latency_by_the_replies_timings(package):
    """With reply_timings every reply's server timings come back and the parts of the latency add up."""
    from recserve.client.openloop import OpenLoopConfig, run_open_loop

    from .conftest import running_server

    with running_server(package, max_queue_delay_ms=1) as server:
        cfg = OpenLoopConfig(
            f"127.0.0.1:{server.port}", rate_rps=40, duration_s=1.0, warmup_s=0.3, request_batch=8,
            processes=1, channels=2, reply_timings=True,
        )  # fmt: skip
        r = run_open_loop(cfg)
    assert r.errors == {} and r.latencies_s.size > 0
    assert r.server_timings_s.shape == (r.latencies_s.size, 3)
    server, queue, compute = r.server_timings_s.T
    assert (queue >= 0).all() and (compute > 0).all() and (server >= compute).all()
    assert (r.latencies_s >= server).all()  # the client's clock covers the server's
    split = r.latency_split_ms(50)
    assert list(split) == ["batcher queue", "batch compute", "rest of server", "outside server"]
    assert split["batch compute"] > 0 and split["outside server"] > 0
    assert len(r.split_summary().splitlines()) == 4
    with pytest.raises(ValueError, match="reply_timings"):
        type(r)(r.rate_rps, r.seconds, r.request_batch, r.latencies_s).latency_split_ms(50)


def test_open_loop_does_not_wait_for_replies():
    """A server that takes 300 ms per reply still sees arrivals at the offered rate (a closed loop of one
    caller would send 3/s); latencies include the 300 ms."""
    from concurrent import futures

    from recserve.client.openloop import OpenLoopConfig, run_open_loop

    def predict(request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(0.3)
        return b""

    handler = grpc.method_handlers_generic_handler(
        "recserve.v1.Predictor", {"Predict": grpc.unary_unary_rpc_method_handler(predict)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        cfg = OpenLoopConfig(f"127.0.0.1:{port}", rate_rps=40, duration_s=1.5, warmup_s=0.2, processes=1)
        r = run_open_loop(cfg, requests=[b""])
    finally:
        server.stop(None)
    assert r.errors == {} and r.latencies_s.size >= 25  # mean 60; a closed loop of 1 would manage ~5
    assert r.percentile_ms(50) >= 300


@pytest.mark.parametrize("taken", ["--metrics-port", "--http-port", "--admin-port", "--port"])
def test_a_taken_port_is_one_line_naming_it_and_no_worker_keeps_running(package, taken):
    ports = {flag: free_port() for flag in ("--port", "--metrics-port", "--http-port", "--admin-port")}
    with socket.socket() as holder:  # another program's listening socket (no SO_REUSEPORT)
        holder.bind(("127.0.0.1", ports[taken]))
        holder.listen()
        args = [a for flag, port in ports.items() for a in (flag, str(port))]
        proc = start_serve("--package", str(package), "--workers", "2", *args)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"{taken} {ports[taken]} on 127.0.0.1: cannot bind: address already in use" in out, out
    assert "Traceback" not in out, out


def test_workers_that_cannot_load_the_package_stop_cleanly_with_one_line_each(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    proc = start_serve("--package", str(tmp_path), "--workers", "2", "--port", str(free_port()))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    # Each worker that got as far as the package says so in one line; the first to fail stops the others,
    # so on a loaded machine the second may be stopped before it reads the manifest.
    assert 1 <= out.count("cannot serve: ") <= 2 and "not a recserve model package manifest" in out, out
    assert "Traceback" not in out, out


def test_workers_default_to_one_per_cpu_on_cpu():
    from recserve.server.operations.config import ServeConfigError
    from recserve.server.operations.workers import resolve_workers

    cpus = len(os.sched_getaffinity(0))
    assert resolve_workers("auto", "cpu", (50051, -1, 50052)) == cpus
    assert resolve_workers("auto", "cuda", (50051, -1, 50052)) == 1
    assert resolve_workers("auto", "cpu", (0, -1, -1)) == 1  # each worker would bind its own port
    assert resolve_workers("3", "cpu", (0,)) == 3
    with pytest.raises(ServeConfigError, match="--workers: expected a number or auto, got 'many'"):
        resolve_workers("many", "cpu", (50051,))
