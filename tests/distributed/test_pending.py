"""Pending without communication: finish runs once, after the work, and its result is cached."""

from rectrain.distributed.comm.pending import Pending


def test_finish_runs_once_and_result_is_cached():
    calls = []
    pending = Pending(work=None, finish=lambda: calls.append(1) or len(calls))
    assert not pending.done and calls == []
    assert pending.wait() == 1 and pending.wait() == 1
    assert pending.done and calls == [1]


def test_ready_wraps_a_value():
    value = object()
    assert Pending.ready(value).wait() is value
