"""Where a run's tables live: the disk-tables settings of ``[train]`` and, with ``planner.memory_plan``,
the planner's memory plan (``rectrain.planner.memory_budget``) applied to the model's tables before any is
built."""

from __future__ import annotations

import dataclasses
import logging

from rectrain.distributed import ShardingEnv
from rectrain.embedding import disk_tables
from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.planner.memory_budget import check_disk_space, plan_memory, rank_budget
from rectrain.planner.types import GB
from rectrain.train.config import RunConfig

logger = logging.getLogger(__name__)
_MB = 1 << 20


def place_tables(config: RunConfig, env: ShardingEnv | None, optimizer: FusedOptimizerConfig) -> RunConfig:
    """Configure the disk tables and return ``config`` with each table's planned ``storage`` (unchanged
    without ``planner.memory_plan``). Raises ``MemoryPlanError`` (a ConfigError naming the numbers) when the
    tables cannot fit even on disk: before anything is allocated."""
    train = config.train
    cache = None if train.disk_cache_mb is None else int(train.disk_cache_mb * _MB)
    disk_tables.configure(disk_tables.DiskTablesSettings(dir=train.disk_tables_dir, cache_bytes=cache))
    if not config.planner.memory_plan:
        return config
    world = env.world_size if env is not None else 1
    local = (env.local_world_size if env is not None else None) or config.planner.local_world_size or 1
    total = (
        None if config.planner.memory_budget_gb is None else int(config.planner.memory_budget_gb * GB * local)
    )
    budget, source = rank_budget(local, total)
    plan = plan_memory(
        config.model.tables,
        optimizer,
        budget,
        world_size=world,
        fixed_bytes=int(config.planner.fixed_memory_gb * GB),
        source=source,
    )
    check_disk_space(plan, disk_tables.settings().base_dir(), local)
    logger.info("memory plan:\n%s", plan.report())
    # Each disk table's row cache is the memory the plan left it (``disk_cache_mb`` stays the fallback).
    caches = {t.name: t.cache_bytes for t in plan.tables if t.storage == "disk"}
    disk_tables.configure(dataclasses.replace(disk_tables.settings(), table_cache_bytes=caches))
    model = dataclasses.replace(config.model, tables=plan.apply(config.model.tables))
    return dataclasses.replace(config, model=model)
