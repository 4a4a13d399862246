"""Running the main job's stages as subprocesses of the real CLIs, and the server's lifetime.

Each stage's stdout and stderr go to ``OUT/logs/<stage>.log``; a failing stage raises ``MainJobError`` naming
the stage, its command line and the tail of its log. ``ServerProcess`` starts ``recserve serve``, waits for
gRPC health SERVING, and is always stopped with SIGTERM (context manager), also on Ctrl-C.
"""

from __future__ import annotations

import logging
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from recserve.client import PredictorClient
from recserve.mainjob.config import MainJobError

logger = logging.getLogger(__name__)

TAIL_LINES = 40
SERVICE_NAME = "recserve.v1.Predictor"


def cli(name: str) -> list[str]:
    """The command prefix of ``rectrain`` / ``recserve`` from the running interpreter's environment."""
    module = {"rectrain": "rectrain", "recserve": "recserve.cli"}[name]
    return [sys.executable, "-m", module]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when it does not exist)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stage_error(stage: str, command: Sequence[str], what: str, log: Path | None) -> MainJobError:
    """The error of a failed stage: what happened, the command line to rerun, the tail of its output."""
    message = f"stage '{stage}' failed: {what}\n  command: {shlex.join(command)}"
    if log is not None:
        tail = log_tail(log)
        message += f"\n  log: {log}" + (f"\n  last lines:\n{_indent(tail)}" if tail else "")
    return MainJobError(message)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def run_stage(stage: str, command: Sequence[str], logs: Path, timeout_s: float | None = None) -> str:
    """Run ``command`` to completion with its output in ``logs/<stage>.log``; return that output."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{stage}.log"
    logger.info("stage %s: %s", stage, shlex.join(command))
    with open(log, "w") as f:
        try:
            rc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise stage_error(stage, command, f"no result after {timeout_s:.0f} s", log) from None
    if rc != 0:
        raise stage_error(stage, command, f"exit code {rc}", log)
    return log.read_text(errors="replace")


class ServerProcess:
    """``recserve serve`` as a child process; ``with`` starts it, waits for SERVING, and stops it on exit."""

    def __init__(self, command: Sequence[str], target: str, log: Path, start_timeout_s: float) -> None:
        self.command = list(command)
        self.target = target
        self.log = log
        self.start_timeout_s = start_timeout_s
        self.exit_code: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    def __enter__(self) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "w")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(self.command, stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            self._wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        with PredictorClient(self.target, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise stage_error("serve", self.command, f"exited with {self._proc.returncode}", self.log)
                try:
                    if client.health(SERVICE_NAME) == "SERVING" and client.health("") == "SERVING":
                        return
                except grpc.RpcError:
                    pass  # not listening yet, or still loading the package
                time.sleep(0.2)
        raise stage_error("serve", self.command, f"not SERVING after {self.start_timeout_s:.0f} s", self.log)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM the server (it drains in-flight calls), wait, SIGKILL if it hangs; return its exit code."""
        if self._proc is None:
            return self.exit_code
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("server did not stop %.0f s after SIGTERM; killing it", timeout_s)
                self._proc.kill()
                self._proc.wait()
        self.exit_code = self._proc.returncode
        self._proc = None
        self._log_file.close()
        return self.exit_code
