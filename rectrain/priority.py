"""Background threads that yield the CPU to the work they run beside (training steps, served batches).

On Linux every thread has its own nice value, so one thread of a process can be made to give way to the
others and to other processes while keeping its own work: the kernel runs it when the CPU would otherwise
idle and preempts it as soon as a normal-priority thread wakes (its virtual runtime grows faster). Used for
the work that is not on anyone's critical path but competes for the same cores: a base export, the writing
of a delta, a server's reading and preparing of the next delta.
"""

from __future__ import annotations

import os
import threading

BACKGROUND_NICE = 10  # CFS weight 110 vs 1024: about a tenth of a core beside one busy normal thread


def lower_thread_priority(by: int = BACKGROUND_NICE) -> None:
    """Raise the calling thread's nice value by ``by`` (at most 19); nothing where threads have no nice
    value of their own or the call is refused (it only ever lowers priority, which needs no privilege)."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + by))
    except (AttributeError, OSError):
        pass
