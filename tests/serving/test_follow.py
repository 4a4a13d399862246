"""``recserve serve --follow DIR``: a real server follows a publish dir while a client calls.

A small "training run" changes some rows and the dense part each step; bases are full exports of its state,
deltas are written with ``write_delta``. Scores at version "N.SEQ" must equal, bit for bit, those of an
in-process Predictor of a full export of the same state.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from recserve.client import PredictorClient
from recserve.errors import StartupError
from recserve.export import export_package
from recserve.export.delta import write_delta
from recserve.runtime import Predictor
from recserve.server.operations.config import ServeConfig, ServeConfigError
from recserve.server.operations.follow import FOLLOWER_NICE, Follower
from recserve.server.operations.metrics import FRESHNESS, MODEL_TIMESTAMP, ServerMetrics, _WorkerFiles
from recserve.server.transports.codec import scores_of
from recserve.server.transports.protos import oip_pb2_grpc
from rectrain.models import build_model

from .conftest import free_port, model_config, parse_metrics, random_batch, running_server, scrape, wait_for
from .test_oip import infer_request
from .test_processes import start_serve, wait_serving

INTERVAL = 0.05  # --follow-interval in these tests
BATCH = random_batch(8, seed=3)
FOLLOW = {"follow_interval_s": INTERVAL, "dense_dtype": "fp32", "workers": 1}


class Training:
    """A model's fp32 state that each ``step`` changes: 40 rows per table and every dense weight."""

    def __init__(self, seed: int = 1) -> None:
        torch.manual_seed(seed)
        self.cfg = model_config()
        self.state = {k: v.detach().clone() for k, v in build_model(self.cfg).state_dict().items()}
        self.tables = {k.split(".")[-2]: k for k in self.state if ".embedding_bags." in k}
        self.step_count = 0

    def step(self) -> tuple[dict, dict]:
        """One step; returns what write_delta takes: rows changed per table as (ids, fp32 rows), dense."""
        self.step_count += 1
        g = torch.Generator().manual_seed(self.step_count)
        rows = {}
        for table, key in self.tables.items():
            weight = self.state[key]
            ids = torch.randperm(weight.shape[0], generator=g)[:40]
            weight[ids] += 0.5 * torch.randn(len(ids), weight.shape[1], generator=g)
            rows[table] = (ids, weight[ids].clone())
        for value in self.dense().values():
            value += 0.05 * torch.randn(value.shape, generator=g)
        return rows, self.dense()

    def dense(self) -> dict:
        return {k: v for k, v in self.state.items() if k not in self.tables.values()}

    def export(self, out: Path, version: str) -> Path:
        return export_package(
            out, model_config=self.cfg, state_dict=self.state, model_name="tiny", version=version
        )


def publish_base(training: Training, publish: Path, version: str) -> Path:
    """A base placed as the trainer places it: written under a dot-name, then renamed into place."""
    staged = training.export(publish / f".staging-{version}", version)
    return staged.rename(publish / version)


def publish_delta(training: Training, publish: Path, base: str, seq: int, **kwargs) -> Path:
    rows, dense = training.step()
    return write_delta(
        publish, base, seq, step=100 + training.step_count, rows=rows, dense_state=dense, **kwargs
    )


def place_corrupted(publish: Path, scratch: Path, base: str, seq: int, rows: dict, dense: dict) -> Path:
    """Delta ``seq`` written beside ``publish`` (its base linked there), a bit of its rows flipped, then
    renamed into ``publish``."""
    scratch.mkdir()
    (scratch / base).symlink_to(publish / base, target_is_directory=True)
    staged = write_delta(scratch, base, seq, step=100 + seq, rows=rows, dense_state=dense)
    data = bytearray((staged / "rows.safetensors").read_bytes())
    data[-1] ^= 1
    (staged / "rows.safetensors").write_bytes(bytes(data))
    placed = publish / staged.relative_to(scratch)  # <base>-deltas/<SEQ>
    placed.parent.mkdir(exist_ok=True)
    return staged.rename(placed)


def reference_scores(training: Training, tmp: Path) -> torch.Tensor:
    package = training.export(tmp / f"reference-{training.step_count}", "1")
    return Predictor.load(package, dense_dtype="fp32").predict(*BATCH)


def wait_version(client: PredictorClient, version: str, seconds: float = 20.0):
    """Calls until a reply says ``version``; that reply."""
    deadline = time.monotonic() + seconds
    while True:
        resp = client.predict_response(*BATCH, timeout=10)
        if resp.model_version == version or time.monotonic() > deadline:
            return resp
        time.sleep(0.005)


def refused(metrics: dict, reason: str) -> float:
    return metrics.get("recserve_model_deltas_refused_total", {}).get((("reason", reason),), 0.0)


def test_deltas_move_the_version_and_score_as_a_full_export_and_a_restart_resumes(tmp_path):
    training, publish = Training(), tmp_path / "publish"
    publish.mkdir()
    base_scores = Predictor.load(publish_base(training, publish, "1"), dense_dtype="fp32").predict(*BATCH)
    freshness = []
    with running_server(None, follow=publish, **FOLLOW) as server:
        client = PredictorClient(f"127.0.0.1:{server.port}")
        first = client.predict_response(*BATCH)
        assert first.model_version == "1" and torch.equal(scores_of(first), base_scores)
        seen = {}
        for seq in (1, 2):
            wall = time.time() - 100 if seq == 2 else None  # delta 2 says its rows were read 100 s ago
            publish_delta(training, publish, "1", seq, wall_time=wall)
            written = time.monotonic()
            resp = wait_version(client, f"1.{seq}")
            freshness.append(time.monotonic() - written)
            assert resp.model_version == f"1.{seq}"
            seen[seq] = scores_of(resp)
            assert torch.equal(seen[seq], reference_scores(training, tmp_path)), f"scores at 1.{seq}"
        assert not torch.equal(seen[1], base_scores) and not torch.equal(seen[2], seen[1])
        oip = oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
        assert oip.ModelInfer(infer_request(*BATCH, raw=True)).model_version == "1.2"
        metrics, later = scrape(server), scrape(server)
        # The worker holds the changed rows only (its overlay), never a copy of a table.
        delta_files = sum(f.stat().st_size for f in (publish / "1-deltas").glob("*/rows.safetensors"))
        assert 0 < server.core.runner.predictor.overlay_bytes <= delta_files
    print(f"freshness (delta written -> first reply at its version): {[round(f, 3) for f in freshness]} s")
    assert max(freshness) < 5.0
    assert metrics["recserve_model_step"][()] == 102
    assert 100 <= metrics["recserve_model_freshness_seconds"][()] < 160
    assert later["recserve_model_freshness_seconds"][()] >= metrics["recserve_model_freshness_seconds"][()]
    assert metrics["recserve_model_deltas_applied_total"][()] == 2
    # A restarted server comes back at the newest version, with the same scores.
    with running_server(None, follow=publish, **FOLLOW) as server:
        resp = PredictorClient(f"127.0.0.1:{server.port}").predict_response(*BATCH)
        assert resp.model_version == "1.2" and torch.equal(scores_of(resp), seen[2])


def _hammer(client: PredictorClient, stop: threading.Event, versions: list, errors: list) -> None:
    while not stop.is_set():
        try:
            versions.append(client.predict_response(*BATCH, timeout=10).model_version)
        except grpc.RpcError as e:  # any failure fails the test
            errors.append(f"{e.code()}: {e.details()}")


def test_refused_deltas_are_counted_once_and_the_last_good_version_serves(tmp_path, caplog):
    training, publish = Training(), tmp_path / "publish"
    publish.mkdir()
    publish_base(training, publish, "1")
    with running_server(None, follow=publish, **FOLLOW) as server, caplog.at_level(logging.ERROR, "recserve"):
        client = PredictorClient(f"127.0.0.1:{server.port}")
        stop, versions, errors = threading.Event(), [], []
        caller = threading.Thread(target=_hammer, args=(client, stop, versions, errors))
        caller.start()
        try:
            publish_delta(training, publish, "1", 1)
            assert wait_version(client, "1.1").model_version == "1.1"
            # Delta 2 corrupted (a bit flipped after its checksum was taken), then placed whole: a file is
            # never changed in place under a reader, which maps it.
            rows2, dense2 = training.step()
            bad = place_corrupted(publish, tmp_path / "scratch", "1", 2, rows2, dense2)
            assert wait_for(lambda: refused(scrape(server), "invalid") == 1, 10)
            time.sleep(10 * INTERVAL)  # many scans: counted and logged once, not retried
            assert refused(scrape(server), "invalid") == 1
            assert client.predict_response(*BATCH).model_version == "1.1"
            # The same delta written again (new files): read again, applied.
            shutil.rmtree(bad.rename(tmp_path / "removed"))  # gone at once, as the trainer retires folders
            write_delta(publish, "1", 2, step=102, rows=rows2, dense_state=dense2)
            assert wait_version(client, "1.2").model_version == "1.2"
            # Delta 4 before 3: refused (once) until 3 arrives, then both apply in order.
            rows3, dense3 = training.step()
            publish_delta(training, publish, "1", 4)
            assert wait_for(lambda: refused(scrape(server), "sequence") == 1, 10)
            time.sleep(10 * INTERVAL)
            assert client.predict_response(*BATCH).model_version == "1.2"
            write_delta(publish, "1", 3, step=103, rows=rows3, dense_state=dense3)
            assert wait_version(client, "1.4").model_version == "1.4"
        finally:
            stop.set()
            caller.join()
        metrics = scrape(server)
    assert errors == []
    sequences = [int(v.partition(".")[2] or 0) for v in versions]  # one caller: replies in order
    assert sequences == sorted(sequences) and {1, 2, 4} <= set(sequences)
    assert refused(metrics, "invalid") == 1 and refused(metrics, "sequence") == 1
    assert metrics["recserve_model_deltas_applied_total"][()] == 4
    assert caplog.text.count("delta refused") == 2, caplog.text


def test_a_new_base_is_swapped_in_with_its_deltas_and_a_delta_of_another_base_is_refused(tmp_path):
    training, publish = Training(), tmp_path / "publish"
    publish.mkdir()
    publish_base(training, publish, "1")
    publish_delta(training, publish, "1", 1)
    with running_server(None, follow=publish, **FOLLOW) as server:
        client = PredictorClient(f"127.0.0.1:{server.port}")
        assert client.predict_response(*BATCH).model_version == "1.1"  # caught up before serving
        training.step()
        publish_base(training, publish, "2")
        publish_delta(training, publish, "2", 1)
        assert wait_version(client, "2.1").model_version == "2.1"
        # A delta of base 1 placed among base 2's: it names another base.
        stray = shutil.copytree(publish / "1-deltas" / "00000001", publish / ".stray")
        stray.rename(publish / "2-deltas" / "00000002")
        assert wait_for(lambda: refused(scrape(server), "base") == 1, 10)
        assert client.predict_response(*BATCH).model_version == "2.1"
        metrics = scrape(server)
    assert metrics["recserve_model_reloads_total"][(("result", "success"),)] == 1
    assert metrics["recserve_model_info"][(("model", "tiny"), ("version", "2"))] == 1


@pytest.mark.slow  # two spawned workers: ~20 s on an idle 2-core machine, most of it their start
def test_two_workers_each_follow_and_share_one_metrics_page(tmp_path):
    training, publish = Training(), tmp_path / "publish"
    publish.mkdir()
    publish_base(training, publish, "1")
    port, metrics_port = free_port(), free_port()
    proc = start_serve(
        "--follow", str(publish), "--follow-interval", str(INTERVAL), "--workers", "2", "--port", str(port),
        "--metrics-port", str(metrics_port), "--dense-dtype", "fp32",
    )  # fmt: skip
    try:
        clients = [PredictorClient(f"127.0.0.1:{port}") for _ in range(4)]  # a channel each: both workers
        wait_serving(clients[0], proc)
        for c in clients:
            c.wait_ready(60)
        publish_delta(training, publish, "1", 1)
        assert {wait_version(c, "1.1").model_version for c in clients} == {"1.1"}

        def page() -> dict:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            return parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())

        assert wait_for(lambda: page().get("recserve_model_deltas_applied_total", {}).get(()) == 2, 20)
        metrics = page()
        assert metrics["recserve_model_step"][()] == 101
        assert 0 <= metrics["recserve_model_freshness_seconds"][()] < 60
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_workers_page_skips_a_metrics_file_being_created_and_reports_the_stalest_freshness(tmp_path):
    """A worker creating its file (empty for a moment) must not fail the scrape of the others' metrics."""
    for pid, stamp in ((111, time.time() - 30), (222, time.time() - 5)):
        values = MmapedDict(str(tmp_path / f"gauge_livemin_{pid}.db"))
        key = mmap_key(MODEL_TIMESTAMP, MODEL_TIMESTAMP, [], [], "t")
        values.write_value(key, stamp, 0.0)
        values.close()
    (tmp_path / "counter_333.db").touch()
    families = {f.name: f for f in _WorkerFiles(str(tmp_path)).collect()}
    assert families[MODEL_TIMESTAMP].samples[0].value == pytest.approx(time.time() - 30, abs=5)
    assert 30 <= families[FRESHNESS].samples[0].value < 40


@pytest.mark.parametrize(
    "options, message",
    [
        ({"watch": Path("w")}, "--follow and --watch: give one"),
        ({"package": Path("p")}, "--follow and --package: give one"),
        ({"follow_interval_s": 0}, "--follow-interval: expected seconds > 0"),
    ],
)
def test_follow_options_are_checked(options, message, tmp_path):
    with pytest.raises(ServeConfigError, match=message):
        ServeConfig(follow=tmp_path, **options)


def test_a_follow_dir_without_a_base_refuses_to_start(tmp_path):
    with (
        pytest.raises(StartupError, match=r"--follow .*: no numbered version directory"),
        running_server(None, follow=tmp_path, **FOLLOW),
    ):
        pass


def test_a_server_starting_on_many_deltas_folds_them_into_one_apply(tmp_path, caplog):
    training, publish = Training(), tmp_path / "publish"
    publish.mkdir()
    publish_base(training, publish, "1")
    for seq in range(1, 51):
        publish_delta(training, publish, "1", seq)
    caplog.set_level(logging.INFO, logger="recserve.runtime.predictor")
    with running_server(None, follow=publish, **FOLLOW) as server:
        resp = PredictorClient(f"127.0.0.1:{server.port}").predict_response(*BATCH)
        metrics = scrape(server)
    assert resp.model_version == "1.50"
    assert torch.equal(scores_of(resp), reference_scores(training, tmp_path))  # latest row won, each verified
    assert metrics["recserve_model_deltas_applied_total"][()] == 50
    applied = [r.getMessage() for r in caplog.records if r.getMessage().startswith("applied delta")]
    assert len(applied) == 1 and applied[0].startswith("applied delta 50 ")


def test_deltas_of_lists_only_the_folders_named_as_the_writer_names_them(tmp_path):
    from recserve.server.operations.follow import deltas_of

    folder = tmp_path / "3-deltas"
    for name in (
        "00000001",
        "00000002",
        "7",
        "00000007",
        "007",
        ".staging-00000009",
        "123456789",
        "0123456789",
    ):
        (folder / name).mkdir(parents=True)
    assert deltas_of(tmp_path, "3") == {
        1: folder / "00000001",
        2: folder / "00000002",
        7: folder / "00000007",
        123456789: folder / "123456789",
    }
    assert deltas_of(tmp_path, "4") == {}


def _none() -> None:
    return None


def test_the_follower_reads_and_prepares_deltas_at_a_lower_priority_than_serving(tmp_path):
    """Its scans (bases and deltas alike) run on a thread the batches preempt; the server's threads keep
    their priority. (Per-thread nice values are Linux's, where the server runs.)"""
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    scanned: list[int] = []
    follower = Follower(tmp_path, ServerMetrics(), interval_s=0.01)
    follower.start(lambda: scanned.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())), _none)
    try:
        wait_for(lambda: scanned, 20)
    finally:
        follower.stop()
    assert scanned[0] == min(19, main + FOLLOWER_NICE) > main
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main
