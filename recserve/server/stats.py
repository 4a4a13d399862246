"""Per-model-version inference statistics, as Triton's statistics extension reports them.

Counts and cumulative durations per stage, measured where the stage runs:

- queue: a request's wait in the dynamic batcher (from ``submit`` to its batch starting);
- compute input: merging the batch's requests into one dense matrix and one KeyedJaggedTensor;
- compute infer: ``Predictor.predict`` on the batch;
- compute output: splitting the batch's scores back per request;
- success / fail: a request from its receipt to its result (or error), once it reached the model.

As in Triton, a request's compute durations are those of the batch it ran in (so the per-request totals are
the batch durations times the requests in the batch), and ``batch_stats`` holds one entry per executed batch
size with each batch counted once. Durations are integer nanoseconds, so they add up exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class BatchStages:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class StatsSnapshot:
    """A consistent copy of one version's statistics."""

    last_inference_ms: int = 0  # ms since the epoch of the last batch's end, 0 before any
    inference_count: int = 0  # examples scored
    execution_count: int = 0  # batches run
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    requests: BatchStages = field(default_factory=BatchStages)  # per request (the batch's time each)
    batches: dict[int, BatchStages] = field(default_factory=dict)  # batch size (examples) -> per batch


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class ModelStats:
    """Thread-safe accumulator: the batch thread records stages, request threads record outcomes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._s = StatsSnapshot()

    def batch_done(
        self, examples: int, requests: int, input_s: float, infer_s: float, output_s: float
    ) -> None:
        """One executed batch of ``examples`` examples from ``requests`` requests."""
        stages = (_ns(input_s), _ns(infer_s), _ns(output_s))
        now_ms = int(time.time() * 1000)
        with self._lock:
            s = self._s
            s.last_inference_ms = now_ms
            s.inference_count += examples
            s.execution_count += 1
            per_batch = s.batches.setdefault(examples, BatchStages())
            for name, ns in zip(("compute_input", "compute_infer", "compute_output"), stages):
                getattr(per_batch, name).add(ns)
                getattr(s.requests, name).add(ns * requests, requests)

    def request_done(self, ok: bool, seconds: float, queue_waits: Sequence[float] = ()) -> None:
        """A request that reached the model: its total time, and its queue wait if it was batched."""
        with self._lock:
            (self._s.success if ok else self._s.fail).add(_ns(seconds))
            for wait in queue_waits:
                self._s.queue.add(_ns(wait))

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            s = self._s
            return StatsSnapshot(
                s.last_inference_ms,
                s.inference_count,
                s.execution_count,
                Duration(s.success.count, s.success.ns),
                Duration(s.fail.count, s.fail.ns),
                Duration(s.queue.count, s.queue.ns),
                _copy_stages(s.requests),
                {size: _copy_stages(b) for size, b in s.batches.items()},
            )


def _copy_stages(b: BatchStages) -> BatchStages:
    return BatchStages(
        Duration(b.compute_input.count, b.compute_input.ns),
        Duration(b.compute_infer.count, b.compute_infer.ns),
        Duration(b.compute_output.count, b.compute_output.ns),
    )
