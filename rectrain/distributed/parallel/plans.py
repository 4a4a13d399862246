"""Write a plan by hand, TorchRec style: ``construct_module_sharding_plan(ebc, {"t1": table_wise(rank=0)})``.

Each helper returns a generator that, given a table and the world geometry, builds the ``ParameterSharding``
with FBGEMM's row blocks (``ceil(rows / parts)``) and column blocks; the result is validated like a planned
plan, so a hand-written plan fails early with the table's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.errors import ConfigError
from rectrain.planner.plan import ModulePlan
from rectrain.planner.shard_shapes import column_blocks, row_blocks
from rectrain.planner.types import EmbeddingComputeKernel, ParameterSharding, Shard, ShardingType
from rectrain.planner.validate import validate_sharding

ParameterShardingGenerator = Callable[[BaseEmbeddingConfig, int, int], ParameterSharding]
_FUSED = EmbeddingComputeKernel.FUSED


def _sharding(kind: ShardingType, shards: list[Shard], kernel=_FUSED) -> ParameterSharding:
    return ParameterSharding(kind, kernel, [s.rank for s in shards], shards)


def data_parallel() -> ParameterShardingGenerator:
    """A full copy of the table on every rank."""

    def make(table: BaseEmbeddingConfig, world_size: int, local_size: int) -> ParameterSharding:
        shard = Shard(0, table.num_embeddings, 0, table.embedding_dim, None)
        return ParameterSharding(ShardingType.DATA_PARALLEL, _FUSED, list(range(world_size)), [shard])

    return make


def table_wise(rank: int) -> ParameterShardingGenerator:
    """The whole table on ``rank``."""

    def make(table: BaseEmbeddingConfig, world_size: int, local_size: int) -> ParameterSharding:
        shard = Shard(0, table.num_embeddings, 0, table.embedding_dim, rank)
        return _sharding(ShardingType.TABLE_WISE, [shard])

    return make


def row_wise() -> ParameterShardingGenerator:
    """Rows split in equal blocks over every rank, in rank order."""

    def make(table: BaseEmbeddingConfig, world_size: int, local_size: int) -> ParameterSharding:
        blocks = row_blocks(table.num_embeddings, world_size)
        shards = [Shard(off, n, 0, table.embedding_dim, r) for r, (off, n) in enumerate(blocks)]
        return _sharding(ShardingType.ROW_WISE, shards)

    return make


def column_wise(ranks: Sequence[int]) -> ParameterShardingGenerator:
    """Columns split in ``len(ranks)`` equal blocks, block ``i`` on ``ranks[i]``."""

    def make(table: BaseEmbeddingConfig, world_size: int, local_size: int) -> ParameterSharding:
        width = -(-table.embedding_dim // len(ranks))
        blocks = column_blocks(table.embedding_dim, width)
        if len(blocks) != len(ranks):
            raise ConfigError(
                f"table {table.name!r}: {table.embedding_dim} columns do not split into {len(ranks)} blocks"
            )
        shards = [Shard(0, table.num_embeddings, off, n, r) for r, (off, n) in zip(ranks, blocks)]
        return _sharding(ShardingType.COLUMN_WISE, shards)

    return make


def table_row_wise(host_index: int) -> ParameterShardingGenerator:
    """Rows split in equal blocks over the ranks of host ``host_index`` (``local_size`` ranks per host)."""

    def make(table: BaseEmbeddingConfig, world_size: int, local_size: int) -> ParameterSharding:
        blocks = row_blocks(table.num_embeddings, local_size)
        first = host_index * local_size
        shards = [Shard(off, n, 0, table.embedding_dim, first + r) for r, (off, n) in enumerate(blocks)]
        return _sharding(ShardingType.TABLE_ROW_WISE, shards)

    return make


def construct_module_sharding_plan(
    module: nn.Module | Sequence[BaseEmbeddingConfig],
    per_param_sharding: Mapping[str, ParameterShardingGenerator],
    sharder: object | None = None,
    local_size: int | None = None,
    world_size: int | None = None,
    device_type: str | None = None,
) -> ModulePlan:
    """``{table: ParameterSharding}`` for a collection (or its table configs), one generator per table.

    TorchRec's signature: ``world_size`` defaults to the default process group's, ``local_size`` to
    ``world_size``; a ``sharder`` that names its sharding types refuses a plan it cannot shard."""
    if isinstance(module, nn.Module):
        configs = getattr(module, "embedding_bag_configs", None) or module.embedding_configs
        tables = list(configs())
    else:
        tables = list(module)
    if world_size is None:
        if not torch.distributed.is_initialized():
            raise ConfigError(
                "construct_module_sharding_plan: give world_size= (no default process group to take it from)"
            )
        world_size = torch.distributed.get_world_size()
    local_size = local_size or world_size
    by_name = {t.name: t for t in tables}
    unknown = sorted(set(per_param_sharding) - set(by_name))
    if unknown:
        raise ConfigError(f"per_param_sharding names unknown tables {unknown}; tables: {sorted(by_name)}")
    plan = {}
    for name, make in per_param_sharding.items():
        table = by_name[name]
        sharding = make(table, world_size, local_size)
        if sharder is not None and hasattr(sharder, "sharding_types"):
            allowed = sharder.sharding_types(device_type or "cpu")
            if str(getattr(sharding.sharding_type, "value", sharding.sharding_type)) not in allowed:
                raise ConfigError(
                    f"table {name!r}: sharding type {sharding.sharding_type} is not one of the "
                    f"sharder's {allowed}"
                )
        validate_sharding(name, sharding, (table.num_embeddings, table.embedding_dim), world_size, local_size)
        plan[name] = sharding
    return plan
