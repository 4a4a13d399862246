"""From a ``RunConfig`` to the objects a run trains: model, sharding plan, optimizers, device.

Order (each a plain function below): build the training model (``build_train_model``), plan its embedding
collection (a plan file, or the planner with the config's options), shard it with
``DistributedModelParallel`` (only when a process group exists; a single process trains the model as is),
then combine the dense optimizer with the fused embedding optimizer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.distributed.parallel.model_parallel import find_collections
from rectrain.distributed.sharded.row_counts import track_row_counts
from rectrain.embedding.backward_choice import BackwardChoice, cpu_backward_choice
from rectrain.embedding.config import BaseEmbeddingConfig, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.optim import CombinedOptimizer
from rectrain.planner import EmbeddingShardingPlanner, ParameterConstraints, ShardingPlan, Topology
from rectrain.planner.types import GIB
from rectrain.train.config import RunConfig
from rectrain.train.schedule import clip_before_step
from rectrain.train.table_storage import place_tables


@dataclass
class TrainingModel:
    """What the loop needs: ``model(batch)`` (the sharded training model), its optimizer and plan.

    ``prediction_model(dense, kjt) -> logits [B]`` is the model inside, used for evaluation;
    ``cpu_backward`` the kernel its tables train with and why (the same on every rank).
    """

    model: nn.Module
    optimizer: CombinedOptimizer
    prediction_model: nn.Module
    plan: ShardingPlan | None
    device: torch.device
    cpu_backward: BackwardChoice


def resolve_device(config: RunConfig, env: ShardingEnv | None) -> torch.device:
    """``train.device``; ``"auto"`` is ``cuda:<local rank>`` when CUDA is available, else cpu."""
    choice = config.train.device
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{config.source}: train.device: 'cuda' but no CUDA device is available")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    local_rank = 0 if env is None else env.local_rank
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def fused_optimizer_config(config: RunConfig) -> FusedOptimizerConfig:
    opt = config.optimizer
    return FusedOptimizerConfig(
        optimizer=opt.sparse, lr=opt.sparse_lr, eps=opt.sparse_eps, weight_decay=opt.sparse_weight_decay
    )


def build_train_module(
    config: RunConfig, device: torch.device | None = None, embedding_device: torch.device | str | None = None
) -> nn.Module:
    """The unsharded training model (``forward(batch) -> (loss, (loss, logits, labels))``).

    ``embedding_device="meta"`` describes the tables without allocating them (``DistributedModelParallel``
    builds each rank's shards); their initial values are the same either way.
    """
    from rectrain.models import build_train_model

    torch.manual_seed(config.train.seed)  # every rank builds identical initial weights
    return build_train_model(
        config.model,
        fused_optimizer=fused_optimizer_config(config),
        device=device,
        embedding_device=embedding_device,
    )


def embedding_tables(config: RunConfig) -> dict[str, list[BaseEmbeddingConfig]]:
    """``{module path of the embedding collection: its tables}`` without allocating the real tables.

    The path comes from a stand-in model whose tables have one row each (same names, dims and features).
    """
    tiny = dataclasses.replace(
        config.model, tables=[dataclasses.replace(t, num_embeddings=1) for t in config.model.tables]
    )
    proxy = dataclasses.replace(config, model=tiny)
    collections = find_collections(build_train_module(proxy))
    if len(collections) != 1:
        raise ConfigError(
            f"{config.source}: model: expected one embedding collection, got {list(collections)}"
        )
    return {path: list(config.model.tables) for path in collections}


def make_plan(
    config: RunConfig,
    tables: dict[str, list[BaseEmbeddingConfig]],
    world_size: int,
    env: ShardingEnv | None,
) -> ShardingPlan:
    """The plan file when given (checked against the world size), else the planner's plan of ``tables``.

    With ``env`` holding a process group, rank 0 plans and broadcasts (every rank must call this).
    """
    planner_cfg, src = config.planner, config.source
    if planner_cfg.plan_file:
        path = Path(planner_cfg.plan_file)
        if not path.is_file():
            raise ConfigError(f"{src}: planner.plan_file: {path} does not exist")
        plan = ShardingPlan.load(path)
        if plan.world_size != world_size:
            raise ConfigError(
                f"{src}: planner.plan_file: {path} is a plan for {plan.world_size} ranks, "
                f"this run has {world_size}"
            )
        return plan
    device_type = resolve_device(config, env).type
    topology = Topology(
        world_size=world_size,
        compute_device=device_type,
        local_world_size=planner_cfg.local_world_size or (env.local_world_size if env else None),
        ddr_cap=_bytes(planner_cfg.ddr_cap_gb),
        hbm_cap=_bytes(planner_cfg.hbm_cap_gb),
    )
    constraints = None
    if planner_cfg.sharding_types:
        names = [t.name for configs in tables.values() for t in configs]
        constraints = {
            n: ParameterConstraints(sharding_types=list(planner_cfg.sharding_types)) for n in names
        }
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=config.train.batch_size,
        constraints=constraints,
        fused_optimizer=fused_optimizer_config(config),
        max_search_evaluations=planner_cfg.max_search_evaluations,
    )
    if env is not None and env.pg is not None:
        return planner.collective_plan(tables, pg=env.pg)
    return planner.plan(tables)


def _bytes(gib: float | None) -> int | None:
    return None if gib is None else int(gib * GIB)


def prediction_module(train_module: nn.Module) -> nn.Module:
    """The prediction model inside a training model (``.prediction_model``, else DLRMTrain's ``.model``)."""
    inner = getattr(train_module, "prediction_model", None) or getattr(train_module, "model", None)
    if not isinstance(inner, nn.Module):
        raise ConfigError(f"{type(train_module).__name__} exposes no prediction model to evaluate")
    return inner


def dense_optimizer(config: RunConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    opt = config.optimizer
    kinds = {
        "sgd": torch.optim.SGD,
        "adagrad": torch.optim.Adagrad,
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
    }
    optimizer = kinds[opt.dense](params, lr=opt.dense_lr, weight_decay=opt.dense_weight_decay)
    if opt.max_grad_norm is not None:
        clip_before_step(optimizer, params, opt.max_grad_norm)
    return optimizer


def build_training(config: RunConfig, env: ShardingEnv | None) -> TrainingModel:
    """The model sharded over ``env``'s process group (or unsharded without one) and its optimizer."""
    config = place_tables(config, env, fused_optimizer_config(config))  # RAM or disk, before allocating
    device = resolve_device(config, env)
    sharded = env is not None and env.pg is not None
    # Unsharded, the tables are built where they train. Sharded, they are only described (meta device) and
    # DistributedModelParallel allocates and initialises this rank's shards on ``device``: no rank ever
    # holds a table it does not own.
    train_module = build_train_module(config, None if sharded else device, "meta" if sharded else None)
    plan = None
    if sharded:
        tables = {path: list(config.model.tables) for path in find_collections(train_module)}
        plan = make_plan(config, tables, env.world_size, env)
        topology = Topology(
            world_size=env.world_size,
            compute_device=device.type,
            local_world_size=env.local_world_size,
            ddr_cap=_bytes(config.planner.ddr_cap_gb),
            hbm_cap=_bytes(config.planner.hbm_cap_gb),
        )
        model: nn.Module = DistributedModelParallel(
            train_module,
            env=env,
            device=device,
            plan=plan,
            batch_size=config.train.batch_size,
            topology=topology,
        )
        if config.train.row_counts:
            track_row_counts(model)
        sparse, inner, collections = model.fused_optimizer, model.module, model.sharded_modules()
        cpu_backward = next(iter(model.cpu_backward.values()))
    else:
        model = inner = train_module
        collections = find_collections(model)
        members = [(path or "model", c.fused_optimizer) for path, c in collections.items()]
        sparse = members[0][1] if len(members) == 1 else CombinedOptimizer(members)
        cpu_backward = cpu_backward_choice(fused_optimizer_config(config), device)
    embedding_params = {id(p) for c in collections.values() for p in c.parameters()}
    dense_params = [p for p in inner.parameters() if p.requires_grad and id(p) not in embedding_params]
    members = [("sparse", sparse)]
    if dense_params:
        members.insert(0, ("dense", dense_optimizer(config, dense_params)))
    return TrainingModel(
        model, CombinedOptimizer(members), prediction_module(inner), plan, device, cpu_backward
    )
