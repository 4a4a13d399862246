"""``MultiProcessTestBase`` / ``MultiProcessContext`` (TorchRec's harness): real processes in a real gloo
group on loopback; a rank that raises fails the test with its message."""

from __future__ import annotations

import multiprocessing
import os

import torch
import torch.distributed as dist

from rectrain.distributed.test_utils.multi_process import MultiProcessContext, MultiProcessTestBase


def _all_reduce(rank: int, world_size: int, backend: str, scale: int) -> None:
    with MultiProcessContext(rank, world_size, backend) as ctx:
        assert ctx.pg is not None and dist.get_world_size(ctx.pg) == world_size
        assert ctx.device == torch.device("cpu")
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, group=ctx.pg)
        assert value.item() == scale * world_size * (world_size + 1) / 2 / scale
    assert not dist.is_initialized()  # the context left the group


def _fails_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise KeyError("rank one's own failure")


class MultiProcessHarnessTest(MultiProcessTestBase):
    @classmethod
    def setUpClass(cls) -> None:
        # Other tests of the same pytest worker may have started the forkserver before any setUp set the
        # rendezvous variables: start it so here, and the ranks must still find the test's group.
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
        process = multiprocessing.get_context("forkserver").Process(target=int)
        process.start()
        process.join()

    def test_ranks_share_a_gloo_group(self) -> None:
        self._run_multi_process_test(callable=_all_reduce, world_size=2, backend="gloo", scale=1)

    def test_a_failing_rank_fails_the_test_with_its_message(self) -> None:
        with self.assertRaisesRegex(AssertionError, "rank 1: Worker raised KeyError: \"rank one's own"):
            self._run_multi_process_test(callable=_fails_on_rank_one, world_size=2)

    def test_per_rank_arguments(self) -> None:
        kwargs = [{"backend": "gloo", "scale": 1}, {"backend": "gloo", "scale": 1}]
        self._run_multi_process_test_per_rank(callable=_all_reduce, world_size=2, kwargs_per_rank=kwargs)
