"""Admission control and outcome counting: each RPC ends in exactly one ``recserve_requests_total`` sample."""

import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import pytest

from recserve.client import PredictorClient
from recserve.client.burst import fire_burst
from recserve.server.transports.admission import AdmissionLimit, QueueLag, default_max_inflight
from recserve.server.transports.codec import encode_predict_request, scores_of

from .conftest import (
    counts_in,
    free_port,
    parse_metrics,
    random_batch,
    request_counts,
    running_server,
    scrape,
    target,
    wait_for,
)

PREDICT = "recserve.v1.Predictor/Predict"
HEALTH = "grpc.health.v1.Health/Check"


def test_default_limit_leaves_spare_threads_and_fits_the_queue():
    assert default_max_inflight(64, 4096) == 56
    assert default_max_inflight(8, 4096) == 7
    assert default_max_inflight(64, 10) == 10
    assert default_max_inflight(1, 4096) == 1
    limit = AdmissionLimit(2)
    assert limit.try_acquire() and limit.try_acquire() and not limit.try_acquire()
    limit.release()
    assert limit.try_acquire()


def test_calls_over_the_limit_are_refused_at_once_and_probes_still_answer(package):
    # A batch waits up to 1 s for company: the two admitted calls hold their slots that long.
    with running_server(package, max_inflight=2, grpc_threads=4, max_queue_delay_ms=1000) as server:
        client = PredictorClient(target(server))
        held = [client._predictor.Predict.future(encode_predict_request(*random_batch(2)), timeout=10)]
        held.append(client._predictor.Predict.future(encode_predict_request(*random_batch(2)), timeout=10))
        assert wait_for(lambda: server.admission.in_flight == 2, 10)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            client.predict(*random_batch(2), timeout=10)
        refused_after = time.monotonic() - start
        assert client.health(timeout=5) == "SERVING"  # probes are exempt
        assert [len(scores_of(f.result())) for f in held] == [2, 2]
        metrics = scrape(server)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-inflight" in info.value.details()
    assert refused_after < 0.5
    assert counts_in(metrics, PREDICT) == {"OK": 2, "RESOURCE_EXHAUSTED": 1}


def test_grpc_level_refusals_are_counted(package, monkeypatch):
    # One pool thread (no reading threads, no room for streaming calls or refusals): while it is taken, gRPC
    # itself refuses every other call ("Concurrent RPC limit").
    for name in ("READING_THREADS", "STREAMING_QUEUE_FACTOR", "SHED_CALLS"):
        monkeypatch.setattr(f"recserve.server.operations.app.{name}", 0)
    with running_server(package, max_inflight=1, grpc_threads=1, max_queue_delay_ms=1000) as server:
        client = PredictorClient(target(server))
        held = client._predictor.Predict.future(encode_predict_request(*random_batch(2)), timeout=10)
        assert wait_for(lambda: server.admission.in_flight == 1, 10)
        codes = []
        for call in (lambda: client.predict(*random_batch(2), timeout=5), lambda: client.health(timeout=5)):
            with pytest.raises(grpc.RpcError) as info:
                call()
            codes.append(info.value.code())
        held.result()
        assert wait_for(lambda: request_counts(server, HEALTH).get("RESOURCE_EXHAUSTED") == 1, 10)
        metrics = scrape(server)
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert counts_in(metrics, PREDICT) == {"OK": 1, "RESOURCE_EXHAUSTED": 1}


def test_cancelled_and_expired_calls_are_counted(package):
    with running_server(package, max_queue_delay_ms=500) as server:
        client = PredictorClient(target(server))
        request = encode_predict_request(*random_batch(2))
        expiring = client._predictor.Predict.future(request, timeout=0.1)
        cancelled = client._predictor.Predict.future(request)
        time.sleep(0.1)
        cancelled.cancel()
        assert expiring.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert cancelled.cancelled()
        assert wait_for(lambda: sum(request_counts(server, PREDICT).values()) == 2, 10)
        metrics = scrape(server)
    assert counts_in(metrics, PREDICT) == {"DEADLINE_EXCEEDED": 1, "CANCELLED": 1}
    assert metrics["recserve_inflight_requests"][()] == 0


def test_a_message_over_the_size_limit_is_counted(package):
    with running_server(package, max_message_bytes=2000) as server:
        with pytest.raises(grpc.RpcError) as info:
            PredictorClient(target(server)).predict(*random_batch(200), timeout=5)
        assert wait_for(lambda: sum(request_counts(server, PREDICT).values()) == 1, 10)
        assert server.admission.in_flight == 0
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.slow
def test_a_burst_of_5000_calls_on_the_default_server_is_shed_and_counted(package):
    port, metrics_port, admin_port = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "recserve.cli", "serve", "--package", str(package), "--port", str(port)]
    cmd += ["--metrics-port", str(metrics_port), "--admin-port", str(admin_port)]  # every other flag: default
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = PredictorClient(f"127.0.0.1:{port}")
        client.wait_ready(90)
        assert wait_for(lambda: client.health(timeout=1) == "SERVING", 90)
        request = encode_predict_request(*random_batch(4)).SerializeToString()
        # Every call is answered or refused before its deadline: none ends DEADLINE_EXCEEDED or CANCELLED,
        # uncounted (before admission control 40 % did). Their speed is bench/overload_burst.py's figure.
        result = fire_burst(f"127.0.0.1:{port}", request, calls=5000, channels=8, timeout=20)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        scraped = lambda: parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())  # noqa: E731
        assert wait_for(lambda: sum(counts_in(scraped(), PREDICT).values()) >= 5000, 10)
        counts = counts_in(scraped(), PREDICT)
    finally:
        proc.terminate()
        proc.wait(30)
    print(result.summary())
    histogram = result.histogram()
    assert set(histogram) <= {"OK", "RESOURCE_EXHAUSTED"}, histogram
    assert histogram["OK"] > 0
    assert counts == dict(histogram)


def test_queue_lag_is_measured_by_the_servers_own_probes_only(package):
    with running_server(package) as server:
        lag = server.lag

        # lag.overloaded() is what each call asks as it arrives: probes run while calls come.
        def measured() -> bool:
            return not lag.overloaded() and all(lag._sent[m] is None and lag._lag[m] > 0 for m in lag.methods)

        assert wait_for(measured, 10)
        assert not lag.overloaded() and lag.lag_s() < lag.target_s
        forged = ((QueueLag.HEADER, f"guess {time.monotonic() - 60!r}"),)
        assert not lag.is_probe(lag.methods[0], forged)
        assert not lag.overloaded()
        client = PredictorClient(target(server))
        call = client._predictor.Predict.with_call
        _, info = call(encode_predict_request(*random_batch(2)), metadata=forged, timeout=10)
        assert info.code() == grpc.StatusCode.OK  # a forged probe is an ordinary call
        metrics = scrape(server)
    assert counts_in(metrics, PREDICT) == {"OK": 1}  # probes are not counted


def test_a_probe_thread_whose_channel_closes_under_it_ends_quietly(package, monkeypatch):
    crashed = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    with running_server(package) as server:
        lag = server.lag
        lag.overloaded()  # a call arrived: the probes are awake
        lag._channel.close()  # as stop() does; the probe threads find it closed at their next call
        for thread in lag._threads:
            thread.join(10)
            assert not thread.is_alive()
        assert crashed == []


def test_a_server_at_rest_sends_no_probes_and_the_first_call_wakes_them(package):
    """Probes (and the read watch's ticks) cost CPU in every worker: they run only while calls arrive."""
    with running_server(package) as server:
        lag, watch = server.lag, server.read_watch
        client = PredictorClient(target(server))
        client.predict(*random_batch(2), timeout=10)

        def quiet() -> bool:  # nothing sent or ticked over half a second
            probes, ticks = lag.probes, watch.ticks
            time.sleep(0.5)
            return lag.probes == probes and watch.ticks == ticks

        assert wait_for(quiet, 10)
        probes = lag.probes
        client.predict(*random_batch(2), timeout=10)
        assert wait_for(lambda: lag.probes > probes, 5)  # probing again, and the call was answered
        assert wait_for(quiet, 10)
