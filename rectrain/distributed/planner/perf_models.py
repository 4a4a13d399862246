"""``torchrec.distributed.planner.perf_models``: rate a placed plan by its busiest rank."""

from __future__ import annotations

from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.topology import Topology


class NoopPerfModel:
    """The largest per-rank sum of the shards' estimated ``perf`` (TorchRec's ``Perf`` or seconds)."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    def rate(self, plan: list[ShardingOption]) -> float:
        perfs = [0.0] * self._topology.world_size
        for option in plan:
            for shard in option.shards:
                perfs[shard.rank] += getattr(shard.perf, "total", shard.perf)
        return max(perfs)


class NoopStorageModel(NoopPerfModel):
    """The largest per-rank sum of the shards' estimated HBM bytes."""

    def rate(self, plan: list[ShardingOption]) -> float:
        hbms = [0] * self._topology.world_size
        for option in plan:
            for shard in option.shards:
                hbms[shard.rank] += shard.storage.hbm
        return max(hbms)
