"""An overload probe: N calls fired at once (futures over a few channels), each call's outcome and latency.

Unlike the closed-loop load generator, nothing waits for a reply before sending the next call: this is the
burst a retry storm or a fan-out makes, and what admission control must shed. Used by
``bench/overload_burst.py`` and the overload test.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc

from recserve.server.transports.protos import PREDICTOR_SERVICE

PREDICT_METHOD = f"/{PREDICTOR_SERVICE}/Predict"


@dataclass
class BurstResult:
    """Per call: the status code name and the seconds from sending it to its end."""

    codes: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    send_seconds: float = 0.0  # from the first call sent to the last

    def histogram(self) -> Counter:
        return Counter(self.codes)

    def percentile(self, q: float, code: str | None = None) -> float:
        xs = sorted(t for c, t in zip(self.codes, self.latencies) if code is None or c == code)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def summary(self) -> str:
        lines = [f"{len(self.codes)} calls sent in {self.send_seconds:.2f} s"]
        for code, n in sorted(self.histogram().items()):
            lines.append(
                f"  {code:<20} {n:>6}   latency p50 {self.percentile(0.5, code) * 1e3:8.1f} ms"
                f"   p99 {self.percentile(0.99, code) * 1e3:8.1f} ms"
                f"   max {self.percentile(1.0, code) * 1e3:8.1f} ms"
            )
        return "\n".join(lines)


def fire_burst(
    target: str, request: bytes, *, calls: int, channels: int = 8, timeout: float = 10.0
) -> BurstResult:
    """Sends ``calls`` copies of a serialized ``PredictRequest`` as fast as it can; waits for every end."""
    chans = [
        # A distinct option per channel keeps gRPC from sharing one connection between them.
        grpc.insecure_channel(target, options=[("recserve.burst_channel", i)])
        for i in range(channels)
    ]
    try:
        for ch in chans:
            grpc.channel_ready_future(ch).result(timeout=30)
        stubs = [ch.unary_unary(PREDICT_METHOD) for ch in chans]  # bytes in, bytes out
        codes: list[str] = [""] * calls
        ends = [0.0] * calls
        starts = [0.0] * calls
        remaining = [calls]
        all_done = threading.Event()
        lock = threading.Lock()

        def on_done(i: int, future: grpc.Future) -> None:
            ends[i] = time.perf_counter()
            codes[i] = future.code().name
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.set()

        futures = []
        for i in range(calls):
            starts[i] = time.perf_counter()
            f = stubs[i % channels].future(request, timeout=timeout)
            f.add_done_callback(lambda fut, i=i: on_done(i, fut))
            futures.append(f)
        sent = time.perf_counter() - starts[0]
        if not all_done.wait(timeout + 30):
            raise TimeoutError(f"{remaining[0]} of {calls} calls never ended")
        return BurstResult(codes, [e - s for s, e in zip(starts, ends)], sent)
    finally:
        for ch in chans:
            ch.close()
