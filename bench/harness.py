"""What every benchmark run records: the machine, the versions, the figures it printed, as one JSON result.

A benchmark script prints its figures as lines ``<name> <number>`` (``rectrain train examples/s 34300``,
``ratio vs torchrec 2.37``) after a ``machine: ...`` line (``machine.py``); each script alternates ours and
the peer within one run, so a ratio always compares figures of one run on one machine. The harness runs the
script (``python -m bench NAME``), keeps those lines, and writes a result with the CPU model, ISA class,
cores, memory, load average at the start (a busy machine's figures are not comparable), the Python / torch /
FBGEMM / rectrain versions and the git commit, under ``bench/results/<machine>/``. ``python -m bench table``
turns the recorded results into the README's tables, so every figure there names its machine and run.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from machine import cpu_model, isa_class

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
# "<name> <number>": a figure; the name is words (letters, digits, / . % @ - _ ( ) +), the number may end in
# x or %. Lines with anything after the number are commentary, not figures.
_FIGURE = re.compile(r"^(?P<name>[A-Za-z][\w /.%@()+-]*?)\s+(?P<value>-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)[x%]?$")


@dataclass
class Machine:
    cpu: str
    isa: str
    cores: int
    memory_gib: float
    line: str  # as the benchmark printed it (names the GPU where one ran)

    @property
    def slug(self) -> str:
        """A folder name for results of this machine class: CPU model, ISA and cores."""
        text = f"{self.cpu} {self.isa} {self.cores}c".lower()
        return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


@dataclass
class Result:
    benchmark: str
    args: list[str]
    machine: Machine
    versions: dict[str, str]
    started: str
    seconds: float
    load_average: float  # 1-minute load average when it started
    exit_code: int
    runs: list[dict[str, float]] = field(default_factory=list)  # figures of each repeat, in order

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        return cls(**{**data, "machine": Machine(**data["machine"])})


def figures(output: str) -> dict[str, float]:
    """The ``<name> <number>`` lines of a benchmark's output (a name seen twice keeps its last value)."""
    found = {}
    for line in output.splitlines():
        match = _FIGURE.match(line.strip())
        if match and not line.startswith((" ", "\t")):
            found[match["name"].strip()] = float(match["value"])
    return found


def this_machine(output: str = "") -> Machine:
    """This machine; ``line`` is the benchmark's own ``machine:`` line when it printed one."""
    line = next((s for s in output.splitlines() if s.startswith("machine: ")), "")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return Machine(cpu_model(), isa_class(), cores, round(memory, 1), line[len("machine: ") :])


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("torch", "fbgemm-gpu-cpu", "fbgemm-gpu", "rectrain"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    out["commit"] = commit or "unknown"
    return out


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def record(result: Result, root: Path = RESULTS) -> Path:
    """Writes ``result`` under ``root/<machine>/<benchmark>-<time>.json``; returns the path."""
    folder = root / result.machine.slug
    folder.mkdir(parents=True, exist_ok=True)
    stamp = result.started.replace(":", "").replace("-", "").replace("+0000", "Z")
    path = folder / f"{result.benchmark}-{stamp}.json"
    path.write_text(result.to_json())
    return path


def load_results(root: Path = RESULTS) -> list[Result]:
    """Every recorded result under ``root``, oldest first."""
    results = [Result.from_dict(json.loads(p.read_text())) for p in sorted(root.glob("*/*.json"))]
    return sorted(results, key=lambda r: r.started)
