"""Test harness: torchrun agents started as separate "nodes" on one machine, meeting over c10d on loopback.

Each node is a real ``torchrun`` process (``--nnodes N --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``)
with its own ranks, so ``LOCAL_WORLD_SIZE`` differs from ``WORLD_SIZE`` as on a real cluster. Output goes to
one log file per node (never a pipe that could fill up). ``Nodes`` kills whatever is still running when the
test ends; ``ranks_of`` finds an agent's rank processes through ``/proc`` (Linux).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_args(
    nnodes: int | str, nproc: int, port: int, *, run_id: str = "test", max_restarts: int = 0
) -> list[str]:
    """torchrun's options for one node of a c10d job on loopback."""
    return [
        *("--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts)),
        *("--rdzv-backend", "c10d", "--rdzv-id", run_id, "--rdzv-endpoint", f"127.0.0.1:{port}"),
        *("--monitor-interval", "0.5"),
    ]


def rank_env(**extra: str) -> dict[str, str]:
    """The environment of a node: one intra-op thread per rank (two cores are shared by everyone), and a
    fresh rendezvous store for every restart (``comm.env.warn_shared_store``)."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **extra,
    }


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from ``/proc/*/stat``; zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def rank_of(pid: int) -> int:
    """The global rank of a rank process (its ``RANK`` environment variable)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Nodes:
    """Started agents (as a context manager: everything still alive is killed at the end)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.ranks: set[int] = set()

    def start(self, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = self.log_dir / f"node_{len(self.procs)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env or rank_env()
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def ranks_of(self, proc: subprocess.Popen, count: int, timeout: float = 120) -> list[int]:
        """The ``count`` rank processes ``proc`` has started (waits until they exist)."""
        deadline = time.monotonic() + timeout
        while True:
            ranks = children_of(proc.pid)
            if len(ranks) >= count:
                self.ranks.update(ranks)
                return ranks
            assert proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.2)

    def wait(self, timeout: float) -> list[int]:
        """Every agent's exit code, waiting at most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"agents still running after {timeout} s\n{self.output()}") from None
        return codes

    def output(self, tail: int = 6000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-tail:]}" for log in self.logs if log.exists())

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            self.ranks.update(children_of(proc.pid))
        for pid in [p.pid for p in self.procs if p.poll() is None] + sorted(self.ranks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


def wait_for(predicate, timeout: float, what: str, nodes: Nodes | None = None) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` (and the nodes' output) otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{nodes.output() if nodes else ''}")
        time.sleep(0.2)
