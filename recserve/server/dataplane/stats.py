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
from dataclasses import asdict, dataclass, field


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
            return merged([self._s])  # a copy: the sum of one


def snapshot_to_json(s: StatsSnapshot) -> dict:
    """``s`` as JSON-ready data (how a worker hands its statistics to the one answering the call)."""
    return asdict(s)


def snapshot_from_json(d: dict) -> StatsSnapshot:
    def duration(x: dict) -> Duration:
        return Duration(int(x["count"]), int(x["ns"]))

    def stages(x: dict) -> BatchStages:
        return BatchStages(*(duration(x[k]) for k in ("compute_input", "compute_infer", "compute_output")))

    return StatsSnapshot(
        int(d["last_inference_ms"]),
        int(d["inference_count"]),
        int(d["execution_count"]),
        duration(d["success"]),
        duration(d["fail"]),
        duration(d["queue"]),
        stages(d["requests"]),
        {int(size): stages(b) for size, b in d["batches"].items()},
    )


def merged(snapshots: Sequence[StatsSnapshot]) -> StatsSnapshot:
    """The statistics of several workers serving one version, as one: counts and durations add up, the last
    inference is the latest of theirs (Triton reports a model's instances the same way)."""
    out = StatsSnapshot()
    for s in snapshots:
        out.last_inference_ms = max(out.last_inference_ms, s.last_inference_ms)
        out.inference_count += s.inference_count
        out.execution_count += s.execution_count
        for name in ("success", "fail", "queue"):
            _add(getattr(out, name), getattr(s, name))
        _add_stages(out.requests, s.requests)
        for size, b in s.batches.items():
            _add_stages(out.batches.setdefault(size, BatchStages()), b)
    return out


def _add(into: Duration, d: Duration) -> None:
    into.add(d.ns, d.count)


def _add_stages(into: BatchStages, b: BatchStages) -> None:
    for name in ("compute_input", "compute_infer", "compute_output"):
        _add(getattr(into, name), getattr(b, name))
