"""A rank ends with its launcher: no orphan ranks training on after their torchrun agent is gone.

torchrun starts each rank in a session of its own, so when the agent is killed (``kill -9``, OOM killer) the
ranks do not get its signal and would go on training and checkpointing with no one to supervise them. On
Linux a rank asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere a
daemon thread polls the parent pid. SIGKILL, not SIGTERM: a rank whose launcher is gone must not start a
checkpoint it may not finish, and the previous checkpoint and ``latest`` stay valid.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_POLL_S = 0.5


def die_with_parent(sig: int = signal.SIGKILL, *, watchdog: bool = False) -> str:
    """Arrange for this process to get ``sig`` when its parent process ends; returns the means used
    (``"prctl"`` or ``"watchdog"``; ``watchdog=True`` polls even where prctl is available)."""
    parent = os.getppid()
    if not watchdog and sys.platform.startswith("linux") and _set_pdeathsig(sig):
        means = "prctl"
    else:
        threading.Thread(target=_watch, args=(parent, sig), name="rectrain-lifeline", daemon=True).start()
        means = "watchdog"
    if os.getppid() != parent:  # the parent ended before the signal was armed
        os.kill(os.getpid(), sig)
    logger.debug("rank %d dies with its parent %d (%s)", os.getpid(), parent, means)
    return means


def _set_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
            return True
        errno = ctypes.get_errno()
        logger.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); watching the parent instead", errno)
    except (OSError, AttributeError) as e:
        logger.warning("prctl is not available (%s); watching the parent instead", e)
    return False


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        threading.Event().wait(_POLL_S)
    os.kill(os.getpid(), sig)
