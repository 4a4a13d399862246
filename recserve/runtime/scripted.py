"""Plain functions run as TorchScript, so a hot path of small tensor ops takes the GIL once per call.

Each eager op gives the GIL up and takes it back; next to a server's other threads every take-back can
wait (see ``serving_graph``). A function written in the TorchScript subset runs here as one call; where
TorchScript cannot compile it (or is gone: it is deprecated as of torch 2.13), the same function runs
eagerly, with the same results.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable)


def script_or_eager(fn: F) -> F:
    """``fn`` compiled by TorchScript on its first call (eager if it cannot be); ``.eager`` is ``fn`` and
    ``.compiled()`` what runs."""
    compiled: list[Callable] = []
    lock = threading.Lock()

    def compile_once() -> Callable:
        with lock:
            if not compiled:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # TorchScript's deprecation warning
                        compiled.append(torch.jit.script(fn))
                except Exception as error:
                    logger.info("%s runs eagerly: TorchScript could not compile it (%s)", fn.__name__, error)
                    compiled.append(fn)
            return compiled[0]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        run = compiled[0] if compiled else compile_once()
        return run(*args, **kwargs)

    call.eager = fn  # type: ignore[attr-defined]
    call.compiled = compile_once  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]
