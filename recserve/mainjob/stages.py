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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc

from recserve.client import PredictorClient
from recserve.mainjob.config import MainJobError

logger = logging.getLogger(__name__)

TAIL_LINES = 40
SERVICE_NAME = "recserve.v1.Predictor"

Echo = Callable[[str], None]


class StageTimer:
    """Numbers and announces the stages (``[3] export: ...``) and keeps each one's wall time."""

    def __init__(self, echo: Echo) -> None:
        self.echo = echo
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        self.echo(f"[{len(self.seconds) + 1}] {name}: {what}")
        start = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - start, 2)


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

    def check_running(self) -> None:
        """Raise the serve stage's error if the server has exited (while the job still needs it)."""
        if self._proc is not None and self._proc.poll() is not None:
            raise stage_error("serve", self.command, f"exited early with {self._proc.returncode}", self.log)

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


class BackgroundStage:
    """A stage's command running beside the job (the online trainer), output in ``logs/<stage>.log``.

    ``with`` starts it and, on leaving early (an error, Ctrl-C), stops it with SIGTERM; ``wait`` is the
    normal end and requires exit code 0.
    """

    def __init__(self, stage: str, command: Sequence[str], logs: Path) -> None:
        self.stage = stage
        self.command = list(command)
        self.log = logs / f"{stage}.log"
        self.exit_code: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    def __enter__(self) -> BackgroundStage:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "w")  # noqa: SIM115 (closed in stop())
        logger.info("stage %s (background): %s", self.stage, shlex.join(self.command))
        self._proc = subprocess.Popen(self.command, stdout=self._log_file, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def check_running(self) -> None:
        """Raise the stage's error if it has exited (while the job still needs it)."""
        if self._proc is not None and self._proc.poll() is not None:
            raise stage_error(
                self.stage, self.command, f"exited early with {self._proc.returncode}", self.log
            )

    def wait(self, timeout_s: float) -> None:
        """Wait for the command to finish by itself; it must exit 0 within ``timeout_s``."""
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise stage_error(
                self.stage, self.command, f"still running after {timeout_s:.0f} s", self.log
            ) from None
        rc = self.stop()
        if rc != 0:
            raise stage_error(self.stage, self.command, f"exit code {rc}", self.log)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM it if still running (torchrun passes it to the ranks), wait, SIGKILL if it hangs."""
        if self._proc is None:
            return self.exit_code
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop %.0f s after SIGTERM; killing it", self.stage, timeout_s)
                self._proc.kill()
                self._proc.wait()
        self.exit_code = self._proc.returncode
        self._proc = None
        self._log_file.close()
        return self.exit_code
