"""``ModelRunner.between_batches``: a change (a delta's commit) runs between two batches, on the batch thread
while batches flow (its caller, the follower, runs at a low priority and never holds the turn a batch waits
for), on the caller's thread when the runner is idle."""

from __future__ import annotations

import threading

import pytest

from recserve.runtime import Predictor
from recserve.server.dataplane import runner as runner_module
from recserve.server.dataplane.batcher import BatcherConfig
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.transports.codec import encode_predict_request
from recserve.server.transports.protos import pb2
from recserve.server.transports.servicer import decode_batchable

from .conftest import random_batch


@pytest.fixture(scope="module")
def runner(packages):
    r = ModelRunner(Predictor.load(packages["1"]), BatcherConfig(max_batch_size=64))
    yield r
    r.close()


def _thread_name() -> str:
    return threading.current_thread().name


def test_while_batches_flow_the_batch_thread_runs_the_change_before_its_next_batch(runner, monkeypatch):
    monkeypatch.setattr(runner_module, "_HANDOVER_S", 60.0)  # the caller never runs it itself here
    request = pb2.PredictRequest.FromString(
        encode_predict_request(*random_batch(4, seed=1)).SerializeToString()
    )
    stop = threading.Event()

    def call() -> None:
        while not stop.is_set():
            runner.submit(decode_batchable(request, runner.schema), None).result(timeout=60)

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    try:
        ran_on = runner.between_batches(_thread_name)
    finally:
        stop.set()
        for caller in callers:
            caller.join()
    assert ran_on.startswith("batcher-")


def test_on_an_idle_runner_the_caller_runs_the_change_and_gets_its_error(runner):
    assert runner.between_batches(_thread_name) == threading.current_thread().name

    def refuse() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        runner.between_batches(refuse)
    assert runner.between_batches(lambda: 7) == 7  # nothing left behind by the refused one
