"""Shard embedding collections in place, no DDP around the rest (TorchRec's ``shard`` / ``shard_modules``).

``DistributedModelParallel`` shards every collection and wraps the dense part in DDP; these run only its
sharding step (``shard_collections``), so the caller keeps its module and parallelises the rest itself:

- ``shard_module(module, plan)`` shards one collection by a module plan (``{table: ParameterSharding}``),
  by a generator per table (``{"t1": table_wise(rank=0)}``) or by one generator for every table;
- ``shard_submodules(model, plan=None)`` shards each collection the plan names (planned collectively when no
  plan is given) and leaves the others, and everything else, as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.parallel.model_parallel import (
    _default_device,
    _materialise_meta,
    _tables_of,
    shard_collections,
)
from rectrain.distributed.parallel.plans import construct_module_sharding_plan
from rectrain.errors import ConfigError
from rectrain.planner.plan import ModulePlan, ShardingPlan
from rectrain.planner.types import ParameterSharding


def _env(env: ShardingEnv | None, caller: str) -> ShardingEnv:
    if env is not None:
        return env
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(f"{caller}: torch.distributed is not initialised; pass env=ShardingEnv(...)")
    return ShardingEnv.from_process_group(dist.group.WORLD)


def _sharders(sharders: list | None, sharder: Any, module: nn.Module) -> list | None:
    if sharder is not None:
        module_type = getattr(sharder, "module_type", None)
        if isinstance(module_type, type) and not isinstance(module, module_type):
            raise ConfigError(
                f"sharder {type(sharder).__name__} shards {module_type.__name__}, not {type(module).__name__}"
            )
        return [sharder]
    return sharders


def module_plan_of(
    collection: nn.Module, plan: ModulePlan | Mapping[str, Any] | Callable, env: ShardingEnv
) -> ModulePlan:
    """``{table: ParameterSharding}`` from a module plan whose entries may be generators, or one generator
    for every table (TorchRec's ``ParameterShardingGenerator`` forms)."""
    names = [t.name for t in _tables_of(collection)]
    if callable(plan) and not isinstance(plan, Mapping):
        plan = dict.fromkeys(names, plan)
    given = {name: s for name, s in plan.items() if isinstance(s, ParameterSharding)}
    generators = {name: g for name, g in plan.items() if not isinstance(g, ParameterSharding)}
    built = construct_module_sharding_plan(
        collection, generators, world_size=env.world_size, local_size=env.local_world_size
    )
    return {name: {**given, **built}[name] for name in plan}


def shard_module(
    module: nn.Module,
    plan: ModulePlan | Mapping[str, Any] | Callable,
    env: ShardingEnv | None = None,
    device: torch.device | str | None = None,
    sharder: Any = None,
) -> nn.Module:
    """The sharded form of one embedding collection (every rank calls it with the same plan)."""
    sharders = _sharders(None, sharder, module)
    env = _env(env, "shard")
    device = torch.device(device) if device is not None else _default_device(env)
    module_plan = module_plan_of(module, plan, env)
    shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in _tables_of(module)}
    full = ShardingPlan({"": module_plan}, env.world_size, {"": shapes}, env.local_world_size)
    return shard_collections(module, env, device, full, sharders, planned_only=True).module


def shard_submodules(
    module: nn.Module,
    env: ShardingEnv | None = None,
    device: torch.device | str | None = None,
    plan: ShardingPlan | None = None,
    sharders: list | None = None,
    init_params: bool = False,
) -> nn.Module:
    """``module`` with each planned embedding collection sharded (see the module doc). ``init_params``
    allocates and initialises what is left on the meta device and moves the model to ``device``."""
    env = _env(env, "shard_modules")
    device = torch.device(device) if device is not None else _default_device(env)
    done = shard_collections(module, env, device, plan, sharders, planned_only=True)
    module = done.module
    if init_params and device.type != "meta":
        _materialise_meta(module, done.paths, device)
        module = module.to(device)
    return module
