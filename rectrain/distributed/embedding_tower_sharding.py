"""``torchrec.distributed.embedding_tower_sharding`` at rectrain's path: the tower sharders, for planning.

TorchRec shards an ``EmbeddingTower`` by keeping its tables and its interaction on one host (table-row-wise
or table-column-wise) so the interaction runs next to its lookups. rectrain does not run sharded towers:
the sharders here plan them (TorchRec's enumerator API lists a tower's tables with the tower as their
``dependency``), and ``DistributedModelParallel`` refuses them with ``unsupported_reason``. Without tower
sharders, DMP shards the collections inside towers as ordinary collections, as TorchRec does.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rectrain.distributed.parallel.sharders import BaseEmbeddingSharder, table_weights
from rectrain.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from rectrain.planner.types import ShardingType

_REASON = (
    "{name}: rectrain does not shard embedding towers (TorchRec keeps a tower's tables and interaction on "
    "one host); leave the tower sharders out to shard the towers' collections as ordinary collections"
)


class EmbeddingTowerSharder(BaseEmbeddingSharder):
    """``torchrec.distributed.embedding_tower_sharding.EmbeddingTowerSharder`` (planning only)."""

    module_type = EmbeddingTower

    @property
    def unsupported_reason(self) -> str:
        """Why ``DistributedModelParallel`` refuses this sharder."""
        return _REASON.format(name=type(self).__name__)

    def sharding_types(self, compute_device_type: str) -> list[str]:
        # A tower stays within one host: its tables are split only over that host's ranks.
        return [ShardingType.TABLE_ROW_WISE.value, ShardingType.TABLE_COLUMN_WISE.value]

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        return table_weights(module.embedding)


class EmbeddingTowerCollectionSharder(EmbeddingTowerSharder):
    """``torchrec.distributed.embedding_tower_sharding.EmbeddingTowerCollectionSharder`` (planning only)."""

    module_type = EmbeddingTowerCollection

    def __init__(self, fused_params: dict[str, Any] | None = None, qcomm_codecs_registry: Any = None) -> None:
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
        self._tower_sharder = EmbeddingTowerSharder(fused_params)

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        tables: dict[str, nn.Parameter] = {}
        for tower in module.towers:
            tables.update(self._tower_sharder.shardable_parameters(tower))
        return tables
