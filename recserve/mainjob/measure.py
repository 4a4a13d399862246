"""The online mode's figures: what was published when, how soon it served, and what the probe saw.

``PublishWatch`` notes each delta's ``wall_time`` (when the trainer read its rows) and each base as they
appear: the trainer retires bases older than the one before the newest, with their deltas, so the publish
dir at the end no longer holds them all. Freshness of a delta is the time from its ``wall_time`` to the
first reply from that version or a later one of the same base (``VersionLog``); deltas published before the
server first replied waited for it to start, not to follow, and are left out.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from recserve.mainjob.traffic import ProbeRecord, version_key

_BASE = re.compile(r"^\d+$")


class PublishWatch:
    """Scans ``publish`` every ``interval_s`` on a thread while in ``with``; once more on leaving."""

    def __init__(self, publish: Path, interval_s: float = 0.25) -> None:
        self.publish = publish
        self.interval_s = interval_s
        self.deltas: dict[tuple[int, int], float] = {}  # (base, sequence) -> wall_time
        self.bases: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publish-watch", daemon=True)

    def __enter__(self) -> PublishWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.scan()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scan()

    def scan(self) -> None:
        if not self.publish.is_dir():
            return
        for base in self.publish.iterdir():
            if _BASE.match(base.name) and (base / "manifest.json").exists():
                self.bases.add(int(base.name))
        for manifest in self.publish.glob("[0-9]*-deltas/[0-9]*/manifest.json"):
            try:
                data = json.loads(manifest.read_text())
            except (OSError, ValueError):
                continue  # retired while read; a complete delta is renamed in whole, never half-written
            self.deltas.setdefault(
                (int(data["base_version"]), int(data["sequence"])), float(data["wall_time"])
            )

    def newest_version(self) -> str | None:
        """``"N.SEQ"`` of the newest delta of the newest base (``"N"`` when it has none yet)."""
        if not self.bases:
            return None
        base = max(self.bases)
        sequence = max((seq for b, seq in self.deltas if b == base), default=0)
        return f"{base}.{sequence}" if sequence else str(base)


def freshness_s(
    deltas: dict[tuple[int, int], float], first_seen: dict[str, float]
) -> tuple[list[float], int]:
    """Sorted freshness of every delta published after the first reply, and how many came before it."""
    if not first_seen:
        return [], len(deltas)
    serving_since = min(first_seen.values())
    seen = sorted((version_key(v), t) for v, t in first_seen.items())
    samples, before = [], 0
    for key, wall_time in deltas.items():
        if wall_time < serving_since:
            before += 1
            continue
        later = [t for v, t in seen if v[0] == key[0] and v >= key]
        if later:
            samples.append(min(later) - wall_time)
    return sorted(samples), before


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of sorted ``values`` (nearest rank; nan when empty)."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


@dataclass(frozen=True)
class Rise:
    """The probe before and after the change, and how soon half the rise of planted-minus-control served."""

    before: ProbeRecord
    after: ProbeRecord
    rise: float
    reaction_s: float


def planted_rise(records: list[ProbeRecord], change_time: float) -> Rise | None:
    """``before``: the last probe before the change file arrived; ``after``: the last probe. ``None`` when
    the probe has no record on one side of the change."""
    before = [r for r in records if r.time < change_time]
    after = [r for r in records if r.time >= change_time]
    if not before or not after:
        return None
    first, last = before[-1], after[-1]
    lift_before = first.planted - first.control
    rise = (last.planted - last.control) - lift_before
    half = next((r for r in after if r.planted - r.control >= lift_before + rise / 2), last)
    return Rise(first, last, rise, half.time - change_time)
