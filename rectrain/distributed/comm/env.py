"""Who am I in the job: ``ShardingEnv`` (world size, rank, process group, host geometry) and its setup.

``init_from_env`` turns torchrun's environment into an initialised default process group (NCCL when CUDA is
available, else gloo). ``intra_and_cross_node_pg`` builds the two subgroup families table-row-wise sharding
needs: the ranks on this host, and the ranks with this local rank on every host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from rectrain.distributed.comm.lifeline import die_with_parent
from rectrain.distributed.comm.timeouts import DEFAULT_TIMEOUT, collective, new_group
from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)

_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class ShardingEnv:
    """World geometry of one rank, as in TorchRec, plus the host layout (``local_world_size`` ranks per host).

    Ranks are laid out host-major like torchrun does: rank = node * local_world_size + local_rank.
    """

    world_size: int
    rank: int
    pg: dist.ProcessGroup | None = None
    local_world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.local_world_size is None:
            object.__setattr__(self, "local_world_size", self.world_size)
        lws = self.local_world_size
        if lws < 1 or self.world_size % lws:
            raise ConfigError(
                f"local_world_size ({lws}) must be >= 1 and divide world_size ({self.world_size}): "
                "every host runs the same number of ranks"
            )

    @property
    def local_rank(self) -> int:
        """This rank's index on its host."""
        return self.rank % self.local_world_size

    @property
    def node(self) -> int:
        """Index of this rank's host."""
        return self.rank // self.local_world_size

    @property
    def num_nodes(self) -> int:
        """Number of hosts."""
        return self.world_size // self.local_world_size

    @classmethod
    def from_process_group(cls, pg: dist.ProcessGroup, local_world_size: int | None = None) -> ShardingEnv:
        """This rank's env in ``pg``; for the default group, local_world_size defaults to LOCAL_WORLD_SIZE."""
        if local_world_size is None and pg == dist.group.WORLD:
            local_world_size = _env_int(os.environ, "LOCAL_WORLD_SIZE", default=dist.get_world_size(pg))
        return cls(dist.get_world_size(pg), dist.get_rank(pg), pg, local_world_size)

    @classmethod
    def from_local(cls, world_size: int, rank: int, local_world_size: int | None = None) -> ShardingEnv:
        """An env without a process group: planning or single-process code that only needs the geometry."""
        return cls(world_size, rank, None, local_world_size)


def default_backend() -> str:
    """``"nccl"`` when this process can use CUDA, otherwise ``"gloo"``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_from_env(backend: str | None = None, timeout: timedelta | None = None) -> ShardingEnv:
    """Initialise the default process group from torchrun's environment variables and return this rank's env.

    With NCCL the current CUDA device is set to LOCAL_RANK first. ``timeout`` (default
    ``timeouts.DEFAULT_TIMEOUT``) bounds every collective: a rank that waits longer for a peer fails with an
    error naming the peer. If the default group already exists it is reused (its backend must match
    ``backend`` when one is given).
    """
    env = os.environ
    backend = backend or default_backend()
    if dist.is_initialized():
        if backend != dist.get_backend():
            raise ConfigError(f"default process group already uses {dist.get_backend()!r}, not {backend!r}")
        return ShardingEnv.from_process_group(dist.group.WORLD)
    missing = [name for name in _REQUIRED_ENV if name not in env]
    if missing:
        raise ConfigError(
            f"init_from_env needs the environment variables {', '.join(missing)}; launch with "
            "`torchrun --nproc-per-node N script.py` (or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
        )
    warn_shared_store(env)
    world_size, rank = _env_int(env, "WORLD_SIZE"), _env_int(env, "RANK")
    local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", default=world_size)
    if backend == "nccl":
        torch.cuda.set_device(_env_int(env, "LOCAL_RANK", default=rank % local_world_size))
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout or DEFAULT_TIMEOUT)
    logger.info("rank %d/%d joined the %s process group", rank, world_size, backend)
    return ShardingEnv(world_size, rank, dist.group.WORLD, local_world_size)


def warn_shared_store(env: Mapping[str, str]) -> None:
    """Warn when torchrun restarts ranks into the rendezvous store of their previous attempt.

    torchrun (torch 2.x) keeps one TCP store for every rendezvous round. A rank of a restarted group can then
    read a peer's address from the failed attempt before the peer's new one replaces it, and its process
    group fails with "Connection refused" (seen here in about half of multi-node restarts).
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's environment gives every round a fresh store.
    """
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if restarts > 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        logger.warning(
            "torchrun --max-restarts %d shares one rendezvous store between restarts, so a restarted rank "
            "may connect to a peer of the failed attempt and fail; set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "in torchrun's environment",
            restarts,
        )


@contextlib.contextmanager
def torchrun_session(backend: str | None = None, timeout: timedelta | None = None) -> Iterator[ShardingEnv]:
    """``init_from_env`` for the length of a ``with`` block, then an orderly teardown.

    Under torchrun the rank first arranges to die with its agent (``lifeline``), so that killing the agent
    leaves no rank behind. Every rank meets at a barrier and destroys the default group before the
    interpreter exits: a rank that exits while its peers still talk to its gloo pairs or to the store it
    hosts can die in the C++ teardown (``terminate called without an active exception``), which torchrun
    reports as a failed job.
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        die_with_parent()
    owns_group = not dist.is_initialized()
    env = init_from_env(backend, timeout)
    failed = False
    try:
        yield env
    except BaseException:
        failed = True
        raise
    finally:
        if owns_group and dist.is_initialized():
            if not failed:  # a failed rank cannot count on its peers reaching the barrier
                with collective("barrier (end of the job)"):
                    dist.barrier()
            dist.destroy_process_group()


def exit_without_finalizing(code: int) -> NoReturn:
    """Flush and leave the process at once, skipping interpreter finalization.

    A rank that ran gloo collectives can abort at exit (``terminate called without an active exception``):
    gloo's worker thread frees the last finished works after the Python side let go of them, and freeing
    their tensors takes the GIL, which a finalizing interpreter hands out by killing the thread. Nothing is
    left to finalize once a rank has torn its process group down, so a distributed command ends here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def intra_and_cross_node_pg(
    env: ShardingEnv, backend: str | None = None
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """This rank's (intra-host group, cross-host group), built collectively.

    ``new_group`` must be called by every rank for every group in the same order, so each rank creates all
    host groups (ranks ``[n * L, (n + 1) * L)``) then all cross groups (ranks ``l, l + L, l + 2L, ...``) and
    keeps its own two. Call it on every rank of ``env.pg``, in the same place of the program.
    """
    if env.world_size != dist.get_world_size():
        raise ValueError(
            f"intra_and_cross_node_pg needs the env of the default group ({dist.get_world_size()} ranks), "
            f"got one of {env.world_size} ranks"
        )
    lws, num_nodes = env.local_world_size, env.num_nodes
    intra = cross = None
    for node in range(num_nodes):
        group = new_group(range(node * lws, (node + 1) * lws), backend=backend)
        if node == env.node:
            intra = group
    for local_rank in range(lws):
        group = new_group(range(local_rank, env.world_size, lws), backend=backend)
        if local_rank == env.local_rank:
            cross = group
    assert intra is not None and cross is not None, "every rank belongs to one host and one cross group"
    return intra, cross


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None
