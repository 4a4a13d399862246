"""The spawn harness itself: results come back by rank, child errors fail the test, hung ranks are killed."""

import time

import pytest
import torch
import torch.distributed as dist

from rectrain.distributed.comm.env import ShardingEnv
from tests.distributed.multiprocess import RankFailedError, run_multiprocess


def _sum_ranks(env: ShardingEnv, offset: int) -> dict:
    t = torch.tensor([float(env.rank + offset)])
    dist.all_reduce(t)
    return {"rank": env.rank, "sum": t.item(), "threads": torch.get_num_threads()}


def _fail_on_rank_one(env: ShardingEnv) -> None:
    if env.rank == 1:
        raise ValueError("boom from the second rank")
    dist.barrier()


def _hang_on_rank_zero(env: ShardingEnv) -> None:
    if env.rank == 0:
        time.sleep(120)


def test_results_by_rank_and_errors_with_rank_and_traceback():
    results = run_multiprocess(_sum_ranks, 2, 10)
    assert results == [{"rank": r, "sum": 21.0, "threads": 1} for r in range(2)]
    with pytest.raises(RankFailedError, match=r"(?s)^rank 1 failed.*ValueError: boom from the second rank"):
        run_multiprocess(_fail_on_rank_one, 2, timeout=60)


@pytest.mark.slow  # waits out a 6 s timeout by design
def test_hung_rank_is_killed_at_timeout():
    start = time.monotonic()
    # Rank 1 returns at once, but on a loaded machine it may still be starting when the 6 s are up.
    with pytest.raises(TimeoutError, match=r"ranks \[0(, 1)?\] still running after 6 s; killed them"):
        run_multiprocess(_hang_on_rank_zero, 2, timeout=6)
    assert time.monotonic() - start < 15
