"""The online mode's traffic on the following server: a closed-loop load and a probe, both noting versions.

Every reply names the model version that scored it (``"N"`` for base N, ``"N.SEQ"`` after delta SEQ);
``VersionLog`` keeps the first time each version replied, which is what freshness is measured against. The
load is a few threads, each on its own channel sending its next request as soon as the last one replied
(closed loop), with requests built from the server's schema as ``recserve loadgen`` builds them and sent
prebuilt (little CPU for the callers). The probe scores one fixed request (planted rows then control rows,
so one version scores both halves) every ``interval_s`` and records ``ProbeRecord``s.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import grpc
import numpy as np

from recserve.client import PredictorClient
from recserve.client.client import open_channel
from recserve.client.loadgen import build_requests
from recserve.server.transports.codec import scores_of
from recserve.server.transports.protos import pb2, pb2_grpc
from rectrain.models.batch import Batch


class VersionLog:
    """The first reply time (unix seconds) of every model version seen; shared by the load and the probe."""

    def __init__(self) -> None:
        self.first_seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def saw(self, version: str, when: float) -> None:
        with self._lock:
            self.first_seen.setdefault(version, when)

    def newest(self) -> str | None:
        with self._lock:
            return max(self.first_seen, key=version_key, default=None)


def version_key(version: str) -> tuple[int, int]:
    """``"3.12"`` -> ``(3, 12)``; a base ``"3"`` -> ``(3, 0)``."""
    base, _, sequence = version.partition(".")
    return int(base), int(sequence or 0)


class _Threads:
    """``count`` threads running ``loop(index, stop)`` between ``start()`` and ``stop()``."""

    def __init__(self, loop: Callable[[int, threading.Event], None], count: int, name: str) -> None:
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=loop, args=(i, self._stop), name=f"{name}-{i}", daemon=True)
            for i in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


class ClosedLoop:
    """``concurrency`` callers of ``batch`` examples, one request in flight per caller; ``with`` runs it."""

    def __init__(self, target: str, versions: VersionLog, concurrency: int, batch: int, seed: int) -> None:
        self.target = target
        self.versions = versions
        with PredictorClient(target, timeout=30.0) as client:
            model = client.metadata()
        serialized = build_requests(model, batch, 16, ids_per_feature=1, seed=seed)
        self.requests = [pb2.PredictRequest.FromString(r) for r in serialized]
        self.latencies_s: list[float] = []
        self.failures: Counter[str] = Counter()  # by status code
        self._threads = _Threads(self._loop, concurrency, "load")

    def __enter__(self) -> ClosedLoop:
        self._threads.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._threads.stop()

    def _loop(self, index: int, stop: threading.Event) -> None:
        with open_channel(self.target) as channel:
            stub = pb2_grpc.PredictorStub(channel)
            i = index
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    reply = stub.Predict(self.requests[i % len(self.requests)], timeout=10.0)
                except grpc.RpcError as e:
                    self.failures[e.code().name] += 1
                    continue
                finally:
                    i += 1
                self.latencies_s.append(time.perf_counter() - start)
                self.versions.saw(reply.model_version, time.time())

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s else float("nan")


@dataclass
class ProbeRecord:
    """One probe: when the reply came (unix s), the version that scored it, the two halves' mean scores."""

    time: float
    version: str
    planted: float
    control: float

    def to_dict(self) -> dict:
        return asdict(self)


class Probe:
    """Scores ``batch`` (planted examples, then as many controls) every ``interval_s``; ``with`` runs it."""

    def __init__(self, target: str, versions: VersionLog, batch: Batch, interval_s: float) -> None:
        self.target = target
        self.versions = versions
        self.batch = batch
        self.interval_s = interval_s
        self.records: list[ProbeRecord] = []
        self.failures: Counter[str] = Counter()  # by status code
        self.scored = threading.Event()  # set at the first record
        self._threads = _Threads(self._loop, 1, "probe")

    def __enter__(self) -> Probe:
        self._threads.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._threads.stop()

    def _loop(self, index: int, stop: threading.Event) -> None:
        half = self.batch.labels.numel() // 2
        with PredictorClient(self.target, timeout=10.0) as client:
            while True:
                try:
                    reply = client.predict_response(self.batch.dense_features, self.batch.sparse_features)
                except grpc.RpcError as e:
                    self.failures[e.code().name] += 1
                else:
                    scores = scores_of(reply)
                    now = time.time()
                    self.versions.saw(reply.model_version, now)
                    planted, control = float(scores[:half].mean()), float(scores[half:].mean())
                    self.records.append(ProbeRecord(now, reply.model_version, planted, control))
                    self.scored.set()
                if stop.wait(self.interval_s):
                    return
