"""``rectrain.priority``: a background thread gives way to the threads it runs beside, and only it."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from rectrain.priority import BACKGROUND_NICE, lower_thread_priority


def _nice(thread_id: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, thread_id)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_only_the_calling_thread_is_lowered_and_never_past_19():
    main = _nice(threading.get_native_id())
    seen: dict[str, int] = {}

    def background() -> None:
        lower_thread_priority()
        seen["once"] = _nice(threading.get_native_id())
        lower_thread_priority(by=40)
        seen["capped"] = _nice(threading.get_native_id())

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen["once"] == min(19, main + BACKGROUND_NICE)
    assert seen["capped"] == 19
    assert _nice(threading.get_native_id()) == main  # the caller's other threads keep theirs
