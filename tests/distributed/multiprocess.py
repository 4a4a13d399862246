"""Test harness: run a function on N real ranks (spawned processes) over loopback and collect the results.

Each rank gets a ``ShardingEnv`` of an initialised default process group (rendezvous through a FileStore in
a fresh temp dir, so no ports are involved), one intra-op thread, and torchrun-like RANK / LOCAL_RANK /
LOCAL_WORLD_SIZE environment variables, which lets a test emulate several hosts on one machine. A failure
on any rank fails the calling test with that rank's traceback; ranks still running at the timeout are killed.

Ranks start through a forkserver that has imported torch, FBGEMM and rectrain once per test process: each
rank is still a fresh single-threaded process with its own process group, but it skips the seconds a
spawned interpreter spends importing them (CI starts a few hundred ranks). A forked rank does not see
environment changes its parent made after the forkserver started, so the parent's environment travels with
the call and the rank adopts it before anything else runs.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rectrain.distributed.comm.env import ShardingEnv, exit_without_finalizing
from rectrain.distributed.comm.lifeline import die_with_parent

# What the forkserver imports once; a rank forked from it finds these in sys.modules. A name that fails to
# import is skipped by the forkserver, and the rank then imports it itself, as a spawned rank would.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.multiprocessing",
    "fbgemm_gpu",
    "pytest",
    "rectrain.distributed",
    "rectrain.distributed.model_parallel",
    "rectrain.distributed.comm",
    "rectrain.distributed.planner",
    "rectrain.checkpoint",
    "rectrain.models",
    "rectrain.train.job",
    "rectrain.metrics",
]


def _start_method() -> str:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    return "forkserver"


class RankFailedError(RuntimeError):
    """A spawned rank raised or died; the message carries its rank and traceback."""


def run_multiprocess(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
    local_world_size: int | None = None,
) -> list[Any]:
    """Run ``fn(env, *args)`` on ``world_size`` spawned ranks; return each rank's return value, by rank.

    ``fn`` and ``args`` must be picklable (a module-level function). Return values travel back with
    ``torch.save`` and are read with ``weights_only=True``: tensors, numbers, strings and containers of them.
    ``local_world_size`` ranks share a pretend host (default: all on one host).
    """
    local_world_size = local_world_size or world_size
    if world_size % local_world_size:
        raise ValueError(f"local_world_size ({local_world_size}) must divide world_size ({world_size})")
    with tempfile.TemporaryDirectory(prefix="rectrain-mp-") as tmp:
        environ = dict(os.environ)
        worker_args = (fn, world_size, local_world_size, tmp, backend, timeout, args, environ)
        method = _start_method()
        ctx = mp.start_processes(_worker, worker_args, nprocs=world_size, join=False, start_method=method)
        try:
            _join(ctx, timeout)
        except RankFailedError as e:
            raise RankFailedError(_first_failure(tmp) or str(e)) from None
        paths = [os.path.join(tmp, f"result_{r}.pt") for r in range(world_size)]
        return [torch.load(path, weights_only=True) for path in paths]


def _join(ctx: mp.ProcessContext, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                _kill(ctx)
                raise TimeoutError(f"ranks {alive} still running after {timeout:.0f} s; killed them")
    except mp.ProcessRaisedException as e:
        _kill(ctx)
        raise RankFailedError(f"rank {e.error_index} failed:\n{e}") from None
    except mp.ProcessExitedException as e:
        _kill(ctx)
        raise RankFailedError(f"rank {e.error_index} exited with code {e.exit_code}:\n{e}") from None


def _first_failure(tmp: str) -> str | None:
    """The traceback of the rank that failed first: once one rank dies, its peers fail in their collectives
    too, and the report should lead with the cause, not with a peer's "connection closed"."""
    reports = []
    for name in os.listdir(tmp):
        if name.startswith("error_"):
            with open(os.path.join(tmp, name)) as f:
                stamp, rank, trace = f.read().split("\n", 2)
            reports.append((float(stamp), int(rank), trace))
    if not reports:
        return None
    reports.sort()
    _, rank, trace = reports[0]
    others = [r for _, r, _ in reports[1:]]
    then = f" (then ranks {others})" if others else ""
    return f"rank {rank} failed{then}:\n{trace}"


def _kill(ctx: mp.ProcessContext) -> None:
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    for p in ctx.processes:
        p.join()


def _worker(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    local_world_size: int,
    tmp: str,
    backend: str,
    timeout: float,
    args: tuple,
    environ: dict[str, str],
) -> None:
    die_with_parent()  # a test run stopped mid-way (pytest -x, Ctrl-C) leaves no rank behind
    os.environ.clear()  # the caller's environment now, not the forkserver's at its start
    os.environ.update(environ)
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size),
        GROUP_RANK=str(rank // local_world_size),
    )
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    store = dist.FileStore(os.path.join(tmp, "store"), world_size)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
    )
    try:
        result = fn(ShardingEnv.from_process_group(dist.group.WORLD), *args)
        torch.save(result, os.path.join(tmp, f"result_{rank}.pt"))
        # No rank tears its process group down while a peer may still be finishing a collective with it.
        dist.barrier()
    except BaseException:
        partial = os.path.join(tmp, f"partial_{rank}.txt")
        with open(partial, "w") as f:
            f.write(f"{time.time()}\n{rank}\n{traceback.format_exc()}")
        os.replace(partial, os.path.join(tmp, f"error_{rank}.txt"))  # a killed writer leaves no torn report
        raise
    finally:
        dist.destroy_process_group()
    exit_without_finalizing(0)
