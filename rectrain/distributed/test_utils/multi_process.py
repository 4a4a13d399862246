"""TorchRec's multi-process test harness: each rank a real process in a real gloo (or nccl) group on loopback.

``MultiProcessTestBase._run_multi_process_test(callable=f, world_size=2, **kwargs)`` starts ``world_size``
processes, each calling ``f(rank=r, world_size=w, **kwargs)``, and fails the test (with each rank's traceback)
if any raised. Inside ``f``, ``with MultiProcessContext(rank, world_size, backend, local_size) as ctx:``
joins the group (``ctx.pg``, ``ctx.device``) and leaves it on exit.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import traceback
import unittest
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rectrain.test_utils import get_free_port, init_distributed_single_host, seed_and_log

_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "GLOO_DEVICE_TRANSPORT", "NCCL_SOCKET_IFNAME")


def _rendezvous_env() -> dict[str, str]:
    """The test's rendezvous variables (a forkserver started before ``setUp`` would not pass them on)."""
    return {k: os.environ[k] for k in _RENDEZVOUS if k in os.environ}


def _in_env(env: dict[str, str], callable: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    os.environ.update(env)
    return callable(*args, **kwargs)


def _reraise_picklable(env: dict[str, str], callable: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``callable`` in the rendezvous ``env``; an exception comes back as a RuntimeError holding its
    traceback (the original may not pickle across the process boundary)."""
    try:
        return _in_env(env, callable, *args, **kwargs)
    except Exception as e:
        raise RuntimeError(f"Worker raised {type(e).__name__}: {e}\n{traceback.format_exc()}") from None


class MultiProcessContext:
    """One rank's membership of the test's process group, as a context manager."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        local_size: int | None = None,
        use_deterministic_algorithms: bool = True,
        disable_cuda_tf_32: bool = True,
    ) -> None:
        self.rank, self.world_size, self.backend, self.local_size = rank, world_size, backend, local_size
        self.disable_cuda_tf_32 = disable_cuda_tf_32
        on_gpu = torch.cuda.is_available() and world_size <= torch.cuda.device_count()
        self.device = torch.device(f"cuda:{rank}") if on_gpu else torch.device("cpu")
        if on_gpu:
            torch.cuda.set_device(self.device)
        if on_gpu and disable_cuda_tf_32:
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        if use_deterministic_algorithms:
            torch.use_deterministic_algorithms(True)
        self.pg: dist.ProcessGroup | None = None

    def __enter__(self) -> MultiProcessContext:
        self.pg = init_distributed_single_host(self.rank, self.world_size, self.backend, self.local_size)
        return self

    def __exit__(self, *exc: object) -> None:
        dist.destroy_process_group()
        torch.use_deterministic_algorithms(False)
        if torch.cuda.is_available() and self.disable_cuda_tf_32:
            torch.backends.cudnn.allow_tf32 = True


class MultiProcessTestBase(unittest.TestCase):
    """A test case whose tests run a function on several ranks (see the module doc)."""

    def __init__(self, methodName: str = "runTest", mp_init_mode: str = "forkserver") -> None:
        super().__init__(methodName)
        self._mp_init_mode = mp_init_mode

    @seed_and_log
    def setUp(self) -> None:
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(get_free_port())
        os.environ["GLOO_DEVICE_TRANSPORT"] = "TCP"
        os.environ["NCCL_SOCKET_IFNAME"] = "lo"
        torch.use_deterministic_algorithms(True)

    def tearDown(self) -> None:
        torch.use_deterministic_algorithms(False)
        os.environ.pop("GLOO_DEVICE_TRANSPORT", None)
        os.environ.pop("NCCL_SOCKET_IFNAME", None)
        super().tearDown()

    def _run_multi_process_test(
        self, *, callable: Callable[..., None], world_size: int = 2, **kwargs: Any
    ) -> None:
        context = multiprocessing.get_context(self._mp_init_mode)
        with context.Pool(processes=world_size) as pool:
            runs = [
                pool.apply_async(
                    functools.partial(
                        _reraise_picklable,
                        _rendezvous_env(),
                        callable,
                        **kwargs,
                        world_size=world_size,
                        rank=r,
                    )
                )
                for r in range(world_size)
            ]
            errors = []
            for rank, run in enumerate(runs):
                run.wait()
                if not run.successful():
                    try:
                        run.get()
                    except Exception as e:
                        errors.append(f"rank {rank}: {e}")
        self.assertEqual(len(errors), 0, "at least one rank failed:\n" + "\n".join(errors))

    def _run_multi_process_test_per_rank(
        self, *, callable: Callable[..., None], world_size: int, kwargs_per_rank: list[dict[str, Any]]
    ) -> None:
        context = multiprocessing.get_context(self._mp_init_mode)
        processes = []
        for rank in range(world_size):
            process = context.Process(
                target=_in_env,
                args=(_rendezvous_env(), callable),
                kwargs={"rank": rank, "world_size": world_size, **kwargs_per_rank[rank]},
            )
            process.start()
            processes.append(process)
        for process in processes:
            process.join()
            self.assertEqual(0, process.exitcode)
