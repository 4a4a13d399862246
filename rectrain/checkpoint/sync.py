"""The few collectives a checkpoint needs, as no-ops in a single process (no process group)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.comm.timeouts import collective
from rectrain.distributed.parallel.model_parallel import DistributedModelParallel


def resolve_env(model: nn.Module, env: ShardingEnv | None) -> ShardingEnv:
    """The given env, else the DMP's, else the default process group's, else a single process."""
    if env is not None:
        return env
    if isinstance(model, DistributedModelParallel):
        return model.env
    if dist.is_available() and dist.is_initialized():
        return ShardingEnv.from_process_group(dist.group.WORLD)
    return ShardingEnv.from_local(1, 0)


def _distributed(env: ShardingEnv) -> bool:
    return env.world_size > 1 and dist.is_available() and dist.is_initialized()


def barrier(env: ShardingEnv) -> None:
    if _distributed(env):
        with collective("barrier (checkpoint)", env.pg):
            dist.barrier(group=env.pg)


def all_gather_object(env: ShardingEnv, value: Any) -> list[Any]:
    """Every rank's ``value`` (small JSON-like metadata), by rank."""
    if not _distributed(env):
        return [value]
    out: list[Any] = [None] * env.world_size
    with collective("all_gather_object (checkpoint)", env.pg):
        dist.all_gather_object(out, value, group=env.pg)
    return out


def broadcast_object(env: ShardingEnv, value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if not _distributed(env):
        return value
    box = [value]
    with collective("broadcast_object (checkpoint)", env.pg):
        dist.broadcast_object_list(box, group=env.pg, group_src=0)
    return box[0]
