"""``--workers N``: N server processes on one port (SO_REUSEPORT), each with its own batcher and predictor.

The kernel spreads connections over the workers. Workers are spawned (never forked: gRPC is not fork-safe
once a server exists). The parent serves one ``/metrics`` page that sums the workers through
prometheus_client's multiprocess mode, forwards SIGTERM/SIGINT to the workers, waits for them to drain, and
exits 0 when they all did.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import tempfile
import threading
from pathlib import Path

from recserve.server.config import ServeConfig

logger = logging.getLogger(__name__)


def _worker_main(cfg: ServeConfig, index: int, log_level: int) -> None:
    logging.basicConfig(format=f"%(asctime)s worker{index} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("recserve").setLevel(log_level)
    from recserve.server.app import run_server

    raise SystemExit(run_server(cfg))


def serve(cfg: ServeConfig) -> int:
    """Runs ``cfg`` in this process (one worker) or in ``cfg.workers`` spawned ones; returns the exit code."""
    if cfg.workers == 1:
        from recserve.server.app import run_server

        return run_server(cfg)
    return _serve_workers(cfg)


def _serve_workers(cfg: ServeConfig) -> int:
    from prometheus_client import multiprocess

    from recserve.server.app import worker_config
    from recserve.server.metrics import prepare_multiprocess_dir, start_metrics_http_server

    with (
        tempfile.TemporaryDirectory(prefix="recserve-metrics-") as metrics_dir,
        tempfile.TemporaryDirectory(prefix="recserve-control-") as control_dir,
    ):
        prepare_multiprocess_dir(Path(metrics_dir))  # inherited by the spawned workers' environment
        ctx = multiprocessing.get_context("spawn")
        level = logging.getLogger("recserve").getEffectiveLevel()
        procs = [
            ctx.Process(
                target=_worker_main,
                args=(worker_config(cfg, i, Path(control_dir)), i, level),
                name=f"recserve-worker{i}",
            )
            for i in range(cfg.workers)
        ]
        for p in procs:
            p.start()
        http = None
        if cfg.metrics_port is not None:
            http = start_metrics_http_server(cfg.metrics_port, cfg.metrics_host, None)
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
