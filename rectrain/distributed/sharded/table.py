"""``ShardedTable``: one rank's part of a sharded table, with the global geometry to save and re-shard it.

It plays the role of TorchRec's ``ShardedTensor`` in state dicts: the global shape, how the table is sharded,
and this rank's shards, each a tensor with its row/column offsets. Checkpoints write the local shards with
their offsets; loading onto another plan cuts the needed rectangles out of whatever was saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.planner.types import ParameterSharding, Shard, ShardingType


def shard_tables_of(
    table: BaseEmbeddingConfig, sharding: ParameterSharding, rank: int
) -> list[tuple[str | None, Shard]]:
    """This rank's shards of ``table``: (kernel table name, shard); the name is None for data-parallel."""
    if sharding.sharding_type is ShardingType.DATA_PARALLEL:
        return [(None, Shard(0, table.num_embeddings, 0, table.embedding_dim, rank))]
    spec = sharding.sharding_spec or []
    # A row shard with no rows (more row blocks than rows) has no kernel table and holds nothing.
    return [(f"{table.name}#{i}", s) for i, s in enumerate(spec) if s.rank == rank and s.num_rows]


@dataclass
class ShardedTable:
    """A table's global shape and sharding plus this rank's ``(shard, tensor)`` pieces (views, not copies)."""

    global_shape: tuple[int, int]
    sharding: ParameterSharding
    local_shards: list[tuple[Shard, Tensor]] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
