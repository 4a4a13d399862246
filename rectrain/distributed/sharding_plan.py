"""``torchrec.distributed.sharding_plan`` at rectrain's path (the engine: ``parallel/plans.py``, and
``planner.shard_shapes`` for the shard blocks)."""

from rectrain.distributed.parallel.plans import (
    ParameterShardingGenerator,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from rectrain.distributed.parallel.sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
    apply_to_all,
    get_default_sharders,
)
from rectrain.planner.shard_shapes import calculate_shard_sizes_and_offsets

__all__ = [
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionSharder",
    "ParameterShardingGenerator",
    "apply_to_all",
    "calculate_shard_sizes_and_offsets",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "get_default_sharders",
    "row_wise",
    "table_row_wise",
    "table_wise",
]
