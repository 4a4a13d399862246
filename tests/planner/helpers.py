"""Shared builders for the planner tests."""

from __future__ import annotations

from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.planner import ShardingPlan


def standard_tables(n: int = 8, rows: int = 100_000, dim: int = 64) -> dict[str, list[EmbeddingBagConfig]]:
    """The standard workload: ``n`` tables of ``rows x dim`` in one module."""
    return {"ebc": [EmbeddingBagConfig(rows, dim, name=f"t{i}") for i in range(n)]}


def rank_storage(plan: ShardingPlan) -> list[int]:
    """Estimated bytes per rank, counting a data-parallel shard on every rank."""
    used = [0] * plan.world_size
    for tables in plan.plan.values():
        for sharding in tables.values():
            for shard in sharding.sharding_spec:
                for rank in sharding.ranks if shard.rank is None else [shard.rank]:
                    used[rank] += shard.storage
    return used


def rank_perf(plan: ShardingPlan) -> list[float]:
    """Estimated seconds per rank, counting a data-parallel shard on every rank."""
    load = [0.0] * plan.world_size
    for tables in plan.plan.values():
        for sharding in tables.values():
            for shard in sharding.sharding_spec:
                for rank in sharding.ranks if shard.rank is None else [shard.rank]:
                    load[rank] += shard.perf
    return load
