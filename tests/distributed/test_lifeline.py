"""A rank dies with its launcher (parent-death signal, or the watchdog thread), and hung collectives name the
rank that did not arrive."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch

from rectrain.distributed import ShardingEnv
from rectrain.distributed.comm.ops import all_to_all_single
from rectrain.distributed.comm.timeouts import CollectiveTimeoutError, new_group
from tests.distributed.agents import ROOT, is_alive, wait_for
from tests.distributed.multiprocess import run_multiprocess

# A parent that starts a child, prints the child's pid and sleeps; the child arms its lifeline and sleeps.
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""
_CHILD = """
import sys, time
from rectrain.distributed.comm.lifeline import die_with_parent
print(die_with_parent(watchdog=sys.argv[1] == "watchdog"), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("means", ["prctl", "watchdog"])
def test_a_child_in_its_own_session_dies_with_its_parent(means):
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _CHILD, means], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == means  # the child shares its parent's stdout
        parent.kill()
        parent.wait()
        start = time.monotonic()
        wait_for(lambda: not is_alive(child), 10, "the child to end with its parent")
        assert time.monotonic() - start < 10
    finally:
        parent.kill()


def _hang_or_exchange(env: ShardingEnv, hang_s: float) -> str | None:
    group = new_group(timeout=timedelta(seconds=3))
    if env.rank == 2:
        time.sleep(hang_s)  # alive, not in the collective: gloo alone would make the others wait
        return None
    try:
        all_to_all_single(torch.ones(3), [1, 1, 1], [1, 1, 1], group=group)
    except CollectiveTimeoutError as e:
        return f"{e.missing}: {e}"
    return "no error"


@pytest.mark.slow
def test_a_hung_rank_is_named_by_the_others_within_the_timeout():
    start = time.monotonic()
    results = run_multiprocess(_hang_or_exchange, 3, 10.0, timeout=120)
    assert results[2] is None
    for rank in (0, 1):
        assert results[rank].startswith("[2]: collective all_to_all_single failed on rank"), results[rank]
        assert "(timeout 3 s): rank 2 did not reach it (hung or dead)" in results[rank]
    assert time.monotonic() - start < 60
