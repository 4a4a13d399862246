"""Model control shared by the workers of one server, here two real servers' reloaders in one process.

``test_processes.py`` checks the same through ``recserve serve --workers 2``; these cover what a process test
cannot arrange: a worker that starts after the call, and one that never answers.
"""

import threading
import time

import pytest

from recserve.client import PredictorClient
from recserve.errors import PackageError, UnavailableError
from recserve.server.operations.control import SharedControl

from .conftest import copy_package, random_batch, running_server, target


def _versions(*servers) -> list[str]:
    return [server.core.runner.schema.version for server in servers]


def test_a_worker_that_starts_after_the_call_applies_it_before_the_call_answers(packages, tmp_path):
    repo = tmp_path / "tiny"
    copy_package(packages["1"], repo / "1")
    copy_package(packages["2"], repo / "2")
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    with running_server(repo / "1") as a, running_server(repo / "1") as b:
        first = SharedControl(a.reloader, control_dir, 0, 2, poll_s=0.01)
        late = SharedControl(b.reloader, control_dir, 1, 2, poll_s=0.01)
        first.start()
        answers = []
        call = threading.Thread(target=lambda: answers.append(first.reload(repo / "2")))
        call.start()
        deadline = time.monotonic() + 30  # worker 0 applies the call (a model load: slower on a busy machine)
        while _versions(a, b)[0] != "2" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        assert not answers and _versions(a, b) == ["2", "1"]  # the call waits for worker 1
        late.start()
        call.join(30)
        assert answers == [("tiny", "2", True)] and _versions(a, b) == ["2", "2"]
        assert late.unload() is True  # either worker can take a call
        assert a.core.current is None and b.core.current is None
        first.stop()
        late.stop()


def test_a_failure_in_any_worker_is_the_calls_error_and_names_it(packages, tmp_path):
    repo = tmp_path / "tiny"
    copy_package(packages["1"], repo / "1")
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    with running_server(repo / "1") as a, running_server(repo / "1") as b:
        controls = [SharedControl(s.reloader, control_dir, i, 2, poll_s=0.01) for i, s in enumerate((a, b))]
        for c in controls:
            c.start()
        broken = copy_package(packages["2"], tmp_path / "broken" / "2")
        (broken / "manifest.json").write_text("{")
        with pytest.raises(PackageError, match=r"^worker 0: .*still serving tiny 1"):
            controls[1].reload(broken)
        assert _versions(a, b) == ["1", "1"]
        for c in controls:
            c.stop()


def test_a_worker_that_never_answers_times_the_call_out_naming_it(packages, tmp_path):
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    with running_server(packages["1"]) as a:
        alone = SharedControl(a.reloader, control_dir, 0, 2, poll_s=0.01, timeout_s=0.5)
        alone.start()
        with pytest.raises(UnavailableError, match=r"unload: worker\(s\) \[1\] of 2 did not apply it"):
            alone.unload()
        assert a.core.current is None  # worker 0 did: the message says the workers may now differ
        alone.stop()


def test_statistics_add_up_over_the_workers_that_serve_the_version(packages, tmp_path):
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    with running_server(packages["1"]) as a, running_server(packages["1"]) as b:
        controls = [SharedControl(s.reloader, control_dir, i, 2, poll_s=0.01) for i, s in enumerate((a, b))]
        for c in controls:
            c.start()
        for server, batches in ((a, (3, 5)), (b, (2,))):
            with PredictorClient(target(server)) as client:
                for n in batches:
                    client.predict(*random_batch(n))
        own = [s.core.runner.stats.snapshot() for s in (a, b)]
        both = controls[1].statistics("tiny", "1")
        assert (both.inference_count, both.success.count) == (10, 3)
        assert both.execution_count == own[0].execution_count + own[1].execution_count
        assert both.requests.compute_infer.ns == sum(s.requests.compute_infer.ns for s in own)
        assert both.last_inference_ms == max(s.last_inference_ms for s in own)
        assert controls[0].statistics("tiny", "2").inference_count == 0  # no worker serves version 2
        for c in controls:
            c.stop()
