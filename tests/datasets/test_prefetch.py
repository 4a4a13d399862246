"""The prefetch thread: items in order, errors where they happened, and a thread that stops when dropped."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from rectrain.datasets.prefetch import Prefetcher


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rectrain-prefetch"]


def _wait_until_gone(timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while _threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _threads()


def test_items_arrive_in_order_and_the_end_repeats():
    items = Prefetcher(iter(range(100)), depth=3)
    assert list(items) == list(range(100))
    assert next(items, "end") == "end"
    assert _wait_until_gone()


def test_an_error_in_the_source_is_raised_after_the_items_before_it():
    def source():
        yield from (1, 2)
        raise KeyError("row 7")

    items = Prefetcher(source(), depth=1)
    assert next(items) == 1 and next(items) == 2
    with pytest.raises(KeyError, match="row 7"):
        next(items)
    assert next(items, "end") == "end"


def test_a_closed_or_dropped_prefetcher_stops_its_thread():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    items = Prefetcher(endless(), depth=2)
    assert next(items) == 0
    items.close()
    assert _wait_until_gone()
    assert len(produced) <= 5  # the queue bounds how far it ran ahead
    dropped = Prefetcher(endless(), depth=2)
    next(dropped)
    del dropped
    gc.collect()
    assert _wait_until_gone()


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], depth=0)
