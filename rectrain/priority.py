"""Background threads that yield the CPU to the work that is measured (a training step, a served batch)."""

from __future__ import annotations

import os
import threading


def lower_thread_priority(by: int = 10) -> None:
    """Raise the calling thread's nice value by ``by`` (Linux schedules threads on their own nice value), so
    that it runs when the busy threads leave CPU time; a no-op where threads have no priority of their own.
    For threads that spend their time in GIL-free kernels and I/O: a niced thread holding the GIL would
    make the others wait for it."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + by))
    except (AttributeError, OSError):
        pass
