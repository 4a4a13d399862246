"""``torchrec.distributed.planner.utils`` at rectrain's path: the planner's searches
(``rectrain.planner.search``), sharder snapshots (``rectrain.planner.sharder_data``) and TorchRec's small
helpers over sharding options."""

from __future__ import annotations

import math
from collections.abc import Iterable

from rectrain.planner.partitioners import reset_shard_rank  # noqa: F401 (TorchRec's path)
from rectrain.planner.refusals import refusing_getattr
from rectrain.planner.search import BinarySearchPredicate, LuusJaakolaSearch
from rectrain.planner.sharder_data import (
    SharderData,
    build_sharder_data,
    build_sharder_data_map,
    sharder_name,
)
from rectrain.planner.sharding_option import ShardingOption

__all__ = [
    "BinarySearchPredicate",
    "LuusJaakolaSearch",
    "SharderData",
    "build_sharder_data",
    "build_sharder_data_map",
    "sharder_name",
]


def prod(iterable: Iterable[int]) -> int:
    return math.prod(iterable)


def bytes_to_gb(num_bytes: int) -> float:
    return float(num_bytes / 1024**3)


def bytes_to_mb(num_bytes: float) -> float:
    return float(num_bytes / 1024**2)


def gb_to_bytes(gb: float) -> int:
    return int(gb * 1024**3)


def mb_to_bytes(mb: float) -> int:
    return int(mb * 1024**2)


def _find_imbalance_tables(
    options: list[ShardingOption], target_imbalance: str = "perf"
) -> list[ShardingOption]:
    """The options on every busiest rank (by ``perf`` total or ``hbm``), largest first; none on one rank.
    Row-wise and data-parallel options are left out: they are on every rank anyway."""
    if target_imbalance not in ("perf", "hbm"):
        raise ValueError(f"Unknown target imbalance {target_imbalance}")
    value = (lambda s: s.perf.total) if target_imbalance == "perf" else (lambda s: s.storage.hbm)
    load: dict[int, float] = {}
    for shard in (s for o in options for s in o.shards):
        load[shard.rank] = load.get(shard.rank, 0) + value(shard)
    busiest = {rank for rank, v in load.items() if v == max(load.values())}
    found = [
        o for o in options
        if {s.rank for s in o.shards} >= busiest and o.sharding_type not in ("data_parallel", "row_wise")
    ]  # fmt: skip
    return sorted(found, key=lambda o: value(o.shards[0]), reverse=True) if len(load) > 1 else []


__getattr__ = refusing_getattr(__name__)
