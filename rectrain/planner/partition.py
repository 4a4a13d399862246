"""Place the shards of one option per table onto ranks, respecting every rank's memory.

Greedy: shards with a fixed rank (data parallel on every rank, row wise shard ``i`` on rank ``i``) go first;
then the movable groups (a table-wise table, one column-wise shard, the row blocks of a table-row-wise table
as one group over a host), heaviest first, each onto the rank (or host) that ends least loaded. ``balance``
picks what "heavy" and "loaded" mean: estimated seconds (``"perf"``) or bytes (``"memory"``). Ties break by
table name, then by the lowest rank, so the result depends only on the inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.topology import Topology
from rectrain.planner.types import Shard, ShardingType

Balance = Literal["perf", "memory"]


@dataclass
class Placement:
    """A complete placement: the options with ranks filled in and the load of every rank."""

    options: list[ShardingOption]
    rank_perf: list[float]
    rank_storage: list[int]

    @property
    def score(self) -> tuple[float, int]:
        """What the planner minimises: the slowest rank's seconds, then the fullest rank's bytes. Seconds
        are compared to 12 significant digits, so that sums equal but for rounding (the same shards added
        in another order) tie and the earlier proposal stays."""
        return (float(f"{max(self.rank_perf):.12g}"), max(self.rank_storage))


@dataclass
class PartitionFailure:
    """Why a placement failed: ``option`` has a shard of ``needed`` bytes and no rank has room for it."""

    option: ShardingOption
    needed: int
    free: list[int]


@dataclass
class _Loads:
    perf: list[float]
    storage: list[int]
    caps: list[int]

    def fits(self, rank: int, nbytes: int) -> bool:
        return self.storage[rank] + nbytes <= self.caps[rank]

    def add(self, rank: int, perf: float, nbytes: int) -> None:
        self.perf[rank] += perf
        self.storage[rank] += nbytes

    def free(self) -> list[int]:
        return [cap - used for cap, used in zip(self.caps, self.storage)]


def partition(
    options: list[ShardingOption], topology: Topology, balance: Balance = "perf"
) -> Placement | PartitionFailure:
    """Place every shard of ``options`` (shards must carry storage and perf estimates)."""
    world = topology.world_size
    loads = _Loads([0.0] * world, [0] * world, [topology.capacity(r) for r in range(world)])
    ranks: list[list[int | None]] = [[s.rank for s in opt.shards] for opt in options]
    for opt in options:
        failure = _place_fixed(opt, loads)
        if failure is not None:
            return failure
    for idx, shard_ids in _movable_groups(options, balance):
        opt = options[idx]
        if opt.sharding_type == ShardingType.TABLE_ROW_WISE:
            best = _best_host(opt, topology, loads, balance)
        else:
            rank = _best_rank(opt.shards[shard_ids[0]], loads, balance)
            best = None if rank is None else (rank,)
        if best is None:
            needed = max(opt.shards[i].storage for i in shard_ids)
            return PartitionFailure(opt, needed, loads.free())
        for i, rank in zip(shard_ids, best):
            loads.add(rank, opt.shards[i].perf, opt.shards[i].storage)
            ranks[idx][i] = rank
    placed = [
        opt.with_shards([dataclasses.replace(s, rank=r) for s, r in zip(opt.shards, rs)])
        for opt, rs in zip(options, ranks)
    ]
    return Placement(placed, loads.perf, loads.storage)


def _place_fixed(opt: ShardingOption, loads: _Loads) -> PartitionFailure | None:
    if opt.sharding_type == ShardingType.DATA_PARALLEL:
        (shard,) = opt.shards
        targets = [(r, shard) for r in range(len(loads.caps))]
    elif opt.sharding_type == ShardingType.ROW_WISE:
        targets = [(shard.rank, shard) for shard in opt.shards]
    else:
        return None
    for rank, shard in targets:
        if not loads.fits(rank, shard.storage):
            return PartitionFailure(opt, shard.storage, loads.free())
    for rank, shard in targets:
        loads.add(rank, shard.perf, shard.storage)
    return None


def _movable_groups(options: list[ShardingOption], balance: Balance) -> list[tuple[int, list[int]]]:
    """``(option index, shard indices)`` of every group the partitioner chooses ranks for, heaviest first."""
    groups = []
    for idx, opt in enumerate(options):
        if opt.sharding_type in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
            groups.extend((idx, [i]) for i in range(len(opt.shards)))
        elif opt.sharding_type == ShardingType.TABLE_ROW_WISE:
            groups.append((idx, list(range(len(opt.shards)))))

    def weight(group: tuple[int, list[int]]) -> float:
        shards = options[group[0]].shards
        return sum(shards[i].perf if balance == "perf" else shards[i].storage for i in group[1])

    return sorted(groups, key=lambda g: (-weight(g), options[g[0]].path, options[g[0]].name, g[1][0]))


def _key(perf: float, storage: int, balance: Balance) -> tuple[float, float]:
    return (perf, storage) if balance == "perf" else (storage, perf)


def _best_rank(shard: Shard, loads: _Loads, balance: Balance) -> int | None:
    """The rank that ends least loaded with ``shard`` on it (lowest rank on ties), None if none has room."""
    best, best_key = None, None
    for rank, cap in enumerate(loads.caps):
        storage = loads.storage[rank] + shard.storage
        if storage > cap:
            continue
        key = _key(loads.perf[rank] + shard.perf, storage, balance)
        if best_key is None or key < best_key:
            best, best_key = rank, key
    return best


def _best_host(
    opt: ShardingOption, topology: Topology, loads: _Loads, balance: Balance
) -> tuple[int, ...] | None:
    """The ranks of the host whose busiest rank ends least loaded with the row blocks of ``opt``."""
    best, best_key = None, None
    local = topology.local_world_size
    for host in range(topology.num_hosts):
        ranks = tuple(host * local + i for i in range(len(opt.shards)))
        if not all(loads.fits(r, s.storage) for r, s in zip(ranks, opt.shards)):
            continue
        perf = max(loads.perf[r] + s.perf for r, s in zip(ranks, opt.shards))
        storage = max(loads.storage[r] + s.storage for r, s in zip(ranks, opt.shards))
        key = _key(perf, storage, balance)
        if best_key is None or key < best_key:
            best, best_key = ranks, key
    return best
