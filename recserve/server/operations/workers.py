"""``--workers N``: N server processes on one port (SO_REUSEPORT), each with its own batcher and predictor.

The kernel spreads connections over the workers. Workers are spawned (never forked: gRPC is not fork-safe
once a server exists). The parent serves one ``/metrics`` page that sums the workers through
prometheus_client's multiprocess mode, forwards SIGTERM/SIGINT to the workers, waits for them to drain, and
exits 0 when they all did.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from recserve.server.operations.config import ServeConfig

logger = logging.getLogger(__name__)


def one_line(text: str) -> str:
    """``text`` with its control characters escaped: an error names files and fields it was given (a path, a
    header entry), and a newline or terminal escape in one must not forge or hide lines of the log (used by
    ``recserve``'s error line too)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cpu_groups(cpus: Sequence[int], workers: int) -> list[list[int]] | None:
    """``cpus`` cut into ``workers`` contiguous groups of equal size (the first ones one larger when they do
    not divide), or None when there are fewer CPUs than workers."""
    cpus = sorted(cpus)
    if len(cpus) < workers:
        return None
    size, extra = divmod(len(cpus), workers)
    bounds = [i * size + min(i, extra) for i in range(workers + 1)]
    return [cpus[bounds[i] : bounds[i + 1]] for i in range(workers)]


def resolve_workers(value: str | int, device: str, ports: Sequence[int]) -> int:
    """``--workers``: a count, or ``auto``: on CPU one worker per CPU this process may use, so that the
    machine is used with no flag (in one process the handler threads and the batch share one interpreter,
    and a second core then serves little more); one on a GPU, and one when a shared port is 0 (each worker
    would bind a port of its own)."""
    if str(value) != "auto":
        try:
            return int(value)
        except ValueError:
            from recserve.server.operations.config import ServeConfigError

            raise ServeConfigError(f"--workers: expected a number or auto, got {value!r}") from None
    if device != "cpu":
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cpus > 1 and 0 in ports:
        logger.info("--workers auto: 1 worker, since a port is 0 (each worker would bind its own)")
        return 1
    return cpus


def _stop_with_parent(parent: int) -> None:
    """SIGTERM this worker (it drains, as on a normal stop) once ``parent`` is gone: a parent killed with
    SIGKILL cannot stop its workers, and orphans would go on holding the shared port."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        logger.warning("the parent process %d is gone; stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_main(cfg: ServeConfig, index: int, log_level: int, cpus: list[int] | None, parent: int) -> None:
    logging.basicConfig(format=f"%(asctime)s worker{index} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("recserve").setLevel(log_level)
    _stop_with_parent(parent)
    if cpus is not None:
        # Before torch starts its threads: they, the gRPC threads and the batch thread inherit it.
        try:
            os.sched_setaffinity(0, cpus)
            logger.info("worker %d runs on CPUs %s", index, cpus)
        except OSError as error:  # a sandbox may refuse it: serve unpinned (and share the threads) instead
            cfg = replace(cfg, pin_workers=False)
            logger.warning(
                "worker %d could not be pinned to CPUs %s (%s); the kernel places it", index, cpus, error
            )
    from recserve.errors import RecServeError
    from recserve.server.operations.app import run_server

    try:
        code = run_server(cfg)
    except RecServeError as error:  # the parent stops the other workers; one line says why
        logger.error("worker %d cannot serve: %s", index, one_line(str(error)))
        code = 2
    raise SystemExit(code)


def serve(cfg: ServeConfig) -> int:
    """Runs ``cfg`` in this process (one worker) or in ``cfg.workers`` spawned ones; returns the exit code."""
    if cfg.workers == 1:
        from recserve.server.operations.app import run_server

        return run_server(cfg)
    return _serve_workers(cfg)


def _serve_workers(cfg: ServeConfig) -> int:
    from prometheus_client import multiprocess

    from recserve.server.operations.app import worker_config
    from recserve.server.operations.metrics import prepare_multiprocess_dir, start_metrics_http_server
    from recserve.server.operations.ports import bind_with, check_bindable

    # The workers share these ports (SO_REUSEPORT): one that another program holds is named here, once.
    for flag, host, port in _shared_ports(cfg):
        check_bindable(flag, host, port, reuse_port=True)
    with (
        tempfile.TemporaryDirectory(prefix="recserve-metrics-") as metrics_dir,
        tempfile.TemporaryDirectory(prefix="recserve-control-") as control_dir,
    ):
        prepare_multiprocess_dir(Path(metrics_dir))  # inherited by the spawned workers' environment
        http = None
        if cfg.metrics_port is not None:  # before any worker starts, so that a taken port stops nothing
            http = bind_with(
                "--metrics-port",
                cfg.metrics_host,
                cfg.metrics_port,
                lambda: start_metrics_http_server(cfg.metrics_port, cfg.metrics_host, None),
            )
        ctx = multiprocessing.get_context("spawn")
        level = logging.getLogger("recserve").getEffectiveLevel()
        groups = _pinned_cpus(cfg)
        # A worker sizes its torch threads by whether it has CPUs of its own (app._default_threads).
        pinned = groups is not None
        configs = [
            replace(worker_config(cfg, i, Path(control_dir)), pin_workers=pinned) for i in range(cfg.workers)
        ]
        procs = [
            ctx.Process(
                target=_worker_main,
                args=(configs[i], i, level, None if groups is None else groups[i], os.getpid()),
                name=f"recserve-worker{i}",
            )
            for i in range(cfg.workers)
        ]
        for p in procs:
            p.start()
        stop = threading.Event()
        previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not stop.wait(0.2):
                if any(not p.is_alive() for p in procs):
                    logger.error("a worker exited early; stopping the others")
                    break
            for p in procs:
                if p.is_alive():
                    p.terminate()  # SIGTERM: each worker drains
            for p in procs:
                p.join()
                multiprocess.mark_process_dead(p.pid, metrics_dir)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if http is not None:
                http.shutdown()
    codes = [p.exitcode for p in procs]
    logger.info("workers exited with %s", codes)
    return 0 if stop.is_set() and all(c == 0 for c in codes) else 1


def _shared_ports(cfg: ServeConfig) -> list[tuple[str, str, int]]:
    ports = [("--port", cfg.host, cfg.port)]
    if cfg.http_port is not None:
        ports.append(("--http-port", cfg.host, cfg.http_port))
    if cfg.admin_port is not None:
        ports.append(("--admin-port", cfg.admin_host, cfg.admin_port))
    return ports


def _pinned_cpus(cfg: ServeConfig) -> list[list[int]] | None:
    """Each worker's CPUs, or None to leave placement to the kernel.

    Measured with 2 workers on 2 cores (the retired bench/serve_ceiling.py's h2load client): pinned, they
    served 14-24 % more requests per second at 8-15 % less CPU per request (nginx's ``worker_cpu_affinity
    auto`` does the same). GPU workers share their device, so they are left alone.
    """
    if not cfg.pin_workers or cfg.device != "cpu" or not hasattr(os, "sched_getaffinity"):
        return None
    groups = cpu_groups(sorted(os.sched_getaffinity(0)), cfg.workers)
    if groups is None:
        logger.info("%d workers on %d CPUs: not pinned", cfg.workers, len(os.sched_getaffinity(0)))
    return groups
