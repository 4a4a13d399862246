"""DynamicBatcher with a real batch function: size and delay limits, bounded queue, deadlines, failures."""

import asyncio
import threading
import time

import pytest

from recserve.errors import DeadlineExceededError, OverloadedError, UnavailableError
from recserve.server.dataplane.batcher import BatcherConfig, DynamicBatcher


class Recorder:
    """A batch function that doubles its inputs and records the batches it saw."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None):
        self.batches: list[list[int]] = []
        self.delay = delay
        self.gate = gate

    def __call__(self, items):
        if self.gate is not None:
            self.gate.wait(5)
        time.sleep(self.delay)
        self.batches.append(list(items))
        return [2 * x for x in items]


def test_concurrent_requests_merge_into_one_batch_and_each_gets_its_result():
    fn = Recorder()
    # The tenth request fills the batch; the long delay keeps a stalled submitting thread (a busy VM once
    # paused it for over 0.2 s) from closing the batch early.
    b = DynamicBatcher(fn, BatcherConfig(max_batch_size=10, max_queue_delay_s=5.0))
    futures = [b.submit(i, size=1) for i in range(10)]
    results = [f.result(5) for f in futures]
    assert [r.result for r in results] == [2 * i for i in range(10)]
    assert fn.batches == [list(range(10))]
    assert all(r.batch_size == 10 for r in results)
    b.close()


def test_batch_closes_at_max_batch_size_in_examples():
    gate = threading.Event()
    fn = Recorder(gate=gate)
    b = DynamicBatcher(fn, BatcherConfig(max_batch_size=8, max_queue_delay_s=0.05))
    first = b.submit(0, size=8)  # a full batch at once; it holds the batch thread until the gate opens
    time.sleep(0.05)
    futures = [b.submit(i, size=3) for i in range(1, 6)]  # 3 + 3 fit in 8 examples, 3 + 3 + 3 do not
    gate.set()
    for f in [first, *futures]:
        f.result(5)
    assert fn.batches == [[0], [1, 2], [3, 4], [5]]
    b.close()


def test_delay_is_measured_from_the_oldest_request():
    fn = Recorder()
    delay, gap = 1.0, 0.6
    b = DynamicBatcher(fn, BatcherConfig(max_batch_size=1000, max_queue_delay_s=delay))
    start = time.monotonic()
    f1 = b.submit(1, size=1)
    time.sleep(gap)
    f2 = b.submit(2, size=1)
    f1.result(5), f2.result(5)
    elapsed = time.monotonic() - start
    # Counted from the newest arrival the batch would close at gap + delay = 1.6 s; a busy host has margin.
    assert delay <= elapsed < delay + gap - 0.1
    assert fn.batches == [[1, 2]]
    b.close()


def test_full_queue_is_refused_at_once():
    gate = threading.Event()
    b = DynamicBatcher(
        Recorder(gate=gate), BatcherConfig(max_batch_size=1, max_queue_delay_s=0, max_queue_size=2)
    )
    running = b.submit(0, size=1)
    time.sleep(0.05)  # item 0 is in the batch function, the queue is empty
    queued = [b.submit(1, size=1), b.submit(2, size=1)]
    start = time.monotonic()
    with pytest.raises(OverloadedError, match="max_queue_size=2"):
        b.submit(3, size=1)
    assert time.monotonic() - start < 1.0  # refused, not queued behind the gate (which opens only below)
    gate.set()
    assert [f.result(5).result for f in [running, *queued]] == [0, 2, 4]
    b.close()


def test_expired_requests_are_dropped_before_compute():
    gate = threading.Event()
    fn = Recorder(gate=gate)
    b = DynamicBatcher(fn, BatcherConfig(max_batch_size=10, max_queue_delay_s=0))
    running = b.submit(0, size=1)
    time.sleep(0.05)
    expired = b.submit(1, size=1, deadline=time.monotonic() + 0.01)
    alive = b.submit(2, size=1, deadline=time.monotonic() + 10)
    time.sleep(0.05)
    gate.set()
    with pytest.raises(DeadlineExceededError):
        expired.result(5)
    assert alive.result(5).result == 4 and running.result(5).result == 0
    assert all(1 not in batch for batch in fn.batches)
    b.close()


def test_a_failing_batch_fails_every_request_of_it_and_the_batcher_goes_on():
    calls = []

    def fn(items):
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("kernel exploded")
        return items

    b = DynamicBatcher(fn, BatcherConfig(max_batch_size=10, max_queue_delay_s=0.1))
    failing = [b.submit(i, size=1) for i in range(3)]
    for f in failing:
        with pytest.raises(RuntimeError, match="kernel exploded"):
            f.result(5)
    assert b.submit(7, size=1).result(5).result == 7
    b.close()


def test_close_drains_queued_requests_then_refuses_new_ones():
    b = DynamicBatcher(Recorder(delay=0.02), BatcherConfig(max_batch_size=2, max_queue_delay_s=0.5))
    futures = [b.submit(i, size=1) for i in range(6)]
    b.close()
    assert [f.result(0).result for f in futures] == [0, 2, 4, 6, 8, 10]
    with pytest.raises(UnavailableError):
        b.submit(9, size=1)


def test_config_rejects_bad_limits():
    with pytest.raises(ValueError, match="max_batch_size"):
        BatcherConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="max_queue_delay_s"):
        BatcherConfig(max_queue_delay_s=-1)


def test_closing_drains_thousands_of_one_request_batches():
    b = DynamicBatcher(lambda items: items, BatcherConfig(max_batch_size=1, max_queue_delay_s=10))
    futures = [b.submit(i, size=1) for i in range(3000)]
    b.close(30)
    assert [f.result(0).result for f in futures] == list(range(3000))


def test_a_batcher_on_the_callers_event_loop_computes_there_between_the_loops_other_work():
    async def main():
        loop = asyncio.get_running_loop()
        ran_on = []

        def fn(items):
            ran_on.append(threading.get_ident())
            return [2 * x for x in items]

        b = DynamicBatcher(fn, BatcherConfig(max_batch_size=4, max_queue_delay_s=0.01), loop=loop)
        # submitted by coroutines on the loop and by another thread: one batch executor for both
        from_loop = [asyncio.wrap_future(b.submit(i, size=1)) for i in range(6)]
        other = await loop.run_in_executor(None, lambda: b.submit(10, size=1))
        results = [c.result for c in await asyncio.gather(*from_loop, asyncio.wrap_future(other))]
        assert results == [0, 2, 4, 6, 8, 10, 20]
        assert set(ran_on) == {threading.get_ident()}  # the loop's own thread: no batch thread
        assert len(ran_on) >= 2  # 4 examples at most per batch
        queued = b.submit(5, size=1)
        b.close()  # on the loop: the queued batch runs here before close returns
        assert queued.result(0).result == 10
        with pytest.raises(UnavailableError):
            b.submit(1, size=1)

    asyncio.run(main())


def test_a_request_cancelled_while_queued_is_left_out_and_the_batcher_goes_on():
    fn = Recorder()
    b = DynamicBatcher(fn, BatcherConfig(max_batch_size=10, max_queue_delay_s=0.05))
    expired = b.submit(1, size=1, deadline=time.monotonic())  # its caller gives up before the batch runs
    left = b.submit(2, size=1)
    assert expired.cancel() and left.cancel()
    kept = b.submit(3, size=1)
    assert kept.result(5).result == 6
    b.close(5)
    assert fn.batches == [[3]]
