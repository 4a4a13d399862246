"""Issue 43 over gRPC: streams that never finish their message, streaming calls that never ask, and compressed
messages, against a real server on loopback, with a normal client beside the attack measuring its effect."""

import gzip
import threading
import time

import grpc
import pytest

from recserve.client import PredictorClient
from recserve.server.transports import reads
from recserve.server.transports.codec import encode_predict_request, scores_of
from recserve.server.transports.reads import GROWTH_CONSTANT, READ_MEMORY_SLACK
from recserve.v1 import predictor_pb2_grpc

from .conftest import free_port, random_batch, request_counts, running_server, target, wait_for
from .hostile import HeldStreams, vm_kib
from .test_processes import start_serve, wait_serving

PREDICT_PATH = "/recserve.v1.Predictor/Predict"
REFLECTION_PATH = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = "4", "8"


def _normal_client(server, seconds: float) -> tuple[int, list]:
    """Predict and health calls in a loop for ``seconds``: (answered, the codes of the failed ones)."""
    client = PredictorClient(target(server))
    answered, errors = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for call in (lambda: client.predict(*random_batch(4), timeout=5), lambda: client.health(timeout=5)):
            try:
                call()
                answered += 1
            except grpc.RpcError as exc:
                errors.append(exc.code())
    return answered, errors


def test_held_predict_streams_hold_no_slot_and_deny_no_one(package):
    with running_server(package, grpc_read_timeout_s=1.0) as server:
        with HeldStreams(server.port, PREDICT_PATH, connections=10, streams=5, interval_s=0.3) as attack:
            time.sleep(0.5)
            assert server.admission.in_flight == 0  # 50 streams open, none admitted: no message arrived
            answered, errors = _normal_client(server, 3.0)
        counts = request_counts(server, PREDICT_PATH[1:])
    assert errors == []
    assert answered > 10
    # The server ended the held streams itself, again and again as they were opened again.
    assert attack.stats.streams_reset > 50
    # Ended at the read deadline; on a loaded machine a few may be refused for queue lag instead.
    assert DEADLINE_EXCEEDED in attack.stats.statuses
    assert set(attack.stats.statuses) <= {DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED}
    assert counts.get("OK", 0) >= answered // 2
    assert counts.get("RESOURCE_EXHAUSTED", 0) + counts.get("DEADLINE_EXCEEDED", 0) > 0


def test_held_streams_shed_for_queue_lag_are_refused_unread_and_hold_up_no_one(package):
    """Calls refused for queue lag go to a pool of two threads, which also answers the lag probes. Held
    streams shed there must be refused without waiting for their message: otherwise they hold both threads
    until the read deadline, the probes and every later refusal queue behind them, the lag reads as
    growing, and each normal call is shed into that queue to wait out its deadline. A lag target no probe
    can meet keeps the server shedding every Predict call for the whole test."""
    with running_server(package, grpc_read_timeout_s=2.0, max_queue_lag_ms=1e-6) as server:
        lag = server.lag
        lag.overloaded()  # as a call arriving does: the probes wake and measure a lag over the target
        assert wait_for(lag.overloaded, 10)
        with HeldStreams(
            server.port, PREDICT_PATH, connections=4, streams=5, interval_s=0.5, reopen=False
        ) as held:
            assert wait_for(lambda: held.stats.streams_opened == 20, 10)
            probes = lag.probes
            client = PredictorClient(target(server))
            predict_codes, health_errors = [], []
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                try:
                    client.predict(*random_batch(4), timeout=5)
                    predict_codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    predict_codes.append(exc.code())
                try:
                    client.health(timeout=5)
                except grpc.RpcError as exc:
                    health_errors.append(exc.code())
            assert wait_for(lambda: sum(held.stats.statuses.values()) == 20, 10), held.stats
            answered_probes = lag.probes - probes
        counts = request_counts(server, PREDICT_PATH[1:])
    assert health_errors == []
    # Every Predict call refused at once for the lag, none left to wait out its deadline behind the streams.
    assert predict_codes and set(predict_codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert held.stats.statuses == {RESOURCE_EXHAUSTED: 20}
    assert counts == {"RESOURCE_EXHAUSTED": 20 + len(predict_codes)}
    # Each refused as gRPC submitted it to the shed pool, no pool thread woken for it.
    assert server._shed_pool.refused == 20 + len(predict_codes)
    assert answered_probes > 1  # the probes were answered meanwhile, not queued behind the held streams


def test_reads_started_together_get_deadlines_spread_over_a_quarter_of_the_timeout():
    """Streams opened in one burst are not all ended (and opened again by their sender) in one tick."""
    deadlines = []
    for _ in range(200):
        read = reads._Read(call=None, outcome=None)
        read.start(100.0, 4.0)
        deadlines.append(read.deadline)
    assert all(104.0 <= d <= 104.0 + 4.0 * reads.READ_DEADLINE_SPREAD for d in deadlines)
    assert max(deadlines) - min(deadlines) > 0.5  # 200 uniform draws over 1 s


def test_a_message_that_does_not_arrive_in_time_ends_deadline_exceeded(package):
    with running_server(package, grpc_read_timeout_s=0.5) as server:
        with HeldStreams(
            server.port, PREDICT_PATH, connections=1, streams=1, interval_s=0.2, reopen=False
        ) as a:
            deadline = time.monotonic() + 5
            while not a.stats.statuses and time.monotonic() < deadline:
                time.sleep(0.05)
        counts = request_counts(server, PREDICT_PATH[1:])
    assert a.stats.statuses == {DEADLINE_EXCEEDED: 1}
    assert counts == {"DEADLINE_EXCEEDED": 1}


def test_streaming_calls_that_never_ask_take_their_own_pool_only_and_end_at_the_deadline(package):
    with (
        running_server(package, grpc_read_timeout_s=1.0, max_streaming_calls=4) as server,
        HeldStreams(server.port, REFLECTION_PATH, connections=4, streams=10, send_prefix=False) as attack,
    ):
        time.sleep(0.5)
        answered, errors = _normal_client(server, 2.0)
    assert errors == []
    assert answered > 10
    # 4 streams run, 12 more queue; each, running or queued, ends when its first message is late; the other
    # 24 are refused as they come.
    assert attack.stats.statuses.get(DEADLINE_EXCEEDED, 0) >= 16
    assert attack.stats.statuses.get(RESOURCE_EXHAUSTED, 0) >= 24


def test_more_held_streams_than_grpcs_rpc_count_deny_no_unary_call_or_health_check(package):
    """350 silent reflection streams and 50 held Predict streams: more than gRPC's count of RPCs in flight
    (one per pool thread) would take if streaming calls were not bounded apart."""
    with (
        running_server(package, grpc_read_timeout_s=2.0, max_streaming_calls=2) as server,
        HeldStreams(server.port, REFLECTION_PATH, connections=35, streams=10, send_prefix=False) as silent,
        HeldStreams(server.port, PREDICT_PATH, connections=10, streams=5, interval_s=0.5) as held,
    ):
        time.sleep(1.0)
        answered, errors = _normal_client(server, 3.0)
    assert errors == []
    assert answered > 10
    assert silent.stats.statuses.get(RESOURCE_EXHAUSTED, 0) >= 300  # refused at once, past 8 per worker
    assert set(held.stats.statuses) <= {DEADLINE_EXCEEDED}


def test_gzip_compressed_requests_are_answered_as_plain_ones(package):
    with running_server(package) as server:
        request = encode_predict_request(*random_batch(64))
        with grpc.insecure_channel(target(server), compression=grpc.Compression.Gzip) as channel:
            compressed = predictor_pb2_grpc.PredictorStub(channel).Predict(request, timeout=10)
        with grpc.insecure_channel(target(server)) as channel:
            plain = predictor_pb2_grpc.PredictorStub(channel).Predict(request, timeout=10)
    assert scores_of(compressed).tolist() == scores_of(plain).tolist()


def _raw_predict(server, payload: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(target(server)) as channel:
        call = channel.unary_unary(PREDICT_PATH)  # bytes as they are: no serializer
        with pytest.raises(grpc.RpcError) as info:
            call(payload, timeout=10)
    return info.value


def test_a_gzip_message_inflating_past_the_size_limit_is_refused_while_inflating(package):
    with running_server(package, max_message_bytes=1 << 20) as server:
        bomb = gzip.compress(b"\0" * (8 << 20))  # 8 KB that inflates to 8 MiB
        error = _raw_predict(server, bomb)
        assert server.budget.used == 0
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "inflates past 1048576 bytes" in error.details()


def test_a_gzip_message_that_does_not_inflate_is_invalid(package):
    with running_server(package) as server:
        error = _raw_predict(server, b"\x1f\x8b" + b"not gzip at all")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gzip-compressed but does not inflate" in error.details()


def test_requests_reserve_from_the_memory_budget_before_they_are_parsed(package):
    with running_server(package, max_message_bytes=1 << 20, request_memory_bytes=1 << 20) as server:
        error = _raw_predict(server, b"\x0a" * (400 << 10))  # 400 KiB: three times that is over 1 MiB
        assert server.budget.used == 0
        PredictorClient(target(server)).predict(*random_batch(4), timeout=5)  # small requests still fit
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--request-memory-mb" in error.details()


def _reset_peak(pid: int) -> bool:
    """Resets ``pid``'s VmHWM to its current resident memory (Linux's clear_refs 5); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.slow  # a server process of its own (its memory is measured apart from the clients'), ~15 s
def test_concurrent_large_messages_raise_a_workers_memory_by_its_budget_plus_a_constant(package):
    """24 clients looping 15 MiB messages at one worker (16 MiB limit, 32 MiB request memory): gRPC core would
    assemble every message at once (+360 MiB and more); the read watch ends the reads that take the worker's
    memory past its limit, so its peak stays within the request memory, the watch's slack, one message more
    and a constant, while a normal client beside the flood still gets answers."""
    budget, message = 32 << 20, 16 << 20
    args = ["--package", str(package), "--port", str(port := free_port()), "--workers", "1"]
    args += ["--max-message-mb", "16", "--request-memory-mb", "32", "--metrics-port", "-1"]
    # Queue-lag shedding off: on a loaded test machine it would refuse the normal client for the flood's lag.
    args += ["--max-queue-lag-ms", "0"]
    proc = start_serve(*args)
    try:
        wait_serving(PredictorClient(f"127.0.0.1:{port}"), proc)
        time.sleep(0.5)  # the watch's baseline: the worker at rest
        if not _reset_peak(proc.pid):
            pytest.skip("this kernel does not let the test reset a process's peak resident memory")
        start = vm_kib(proc.pid, "VmRSS") << 10
        payload = b"\x0a" * (15 << 20)
        stop = threading.Event()
        codes: dict[str, int] = {}

        def flood() -> None:
            opts = [("grpc.max_send_message_length", -1)]
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as channel:
                call = channel.unary_unary(PREDICT_PATH)
                while not stop.is_set():
                    try:
                        call(payload, timeout=10)
                        code = "OK"
                    except grpc.RpcError as exc:
                        code = exc.code().name
                    codes[code] = codes.get(code, 0) + 1

        clients = [threading.Thread(target=flood) for _ in range(24)]
        for t in clients:
            t.start()
        try:
            time.sleep(1.0)
            client = PredictorClient(f"127.0.0.1:{port}")
            answered = 0
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                try:
                    client.predict(*random_batch(4), timeout=5)
                    answered += 1
                except grpc.RpcError as exc:  # refused while the flood holds the memory: retried
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    time.sleep(0.05)
        finally:
            stop.set()
            for t in clients:
                t.join()
        growth = (vm_kib(proc.pid, "VmHWM") << 10) - start
    finally:
        proc.terminate()
        proc.wait(60)
    assert answered > 0
    assert sum(codes.values()) > 24  # the flood kept coming
    assert codes.get("RESOURCE_EXHAUSTED", 0) > 0  # ended reads and refused messages
    assert growth <= budget + READ_MEMORY_SLACK + message + GROWTH_CONSTANT, f"+{growth / 2**20:.0f} MiB"
