"""The planner's memory plan: which tables train in RAM and which on disk, within a rank's memory budget.

A rank's budget is by default the host's memory limit (the cgroup's ``memory.max`` / ``memory.limit_in_bytes``
where one is set, else ``MemAvailable``) shared equally among the host's ranks. Tables go to RAM in order,
hottest first when per-row lookup counts are given (lookups per byte), else smallest first, until the RAM
budget is spent; the rest are disk tables (``storage = "disk"``, ``rectrain.embedding.disk_tables``), and the
memory left over is their page cache, shared in proportion to their lookups (else their size). A table the
config already puts on disk stays there. With counts, each disk table's expected hit rate is the share of
its lookups that go to the rows its cache holds (hottest rows first). A plan whose fixed memory, RAM tables
and the least cache of its disk tables (``min_cache_fraction`` of each) exceed the budget is refused before
anything is allocated, with the numbers.

Per-rank sizes assume each table is spread evenly over ``world_size`` ranks (row-wise): ``bytes / ranks``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rectrain.embedding.config import BaseEmbeddingConfig, DataType, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.planner.types import GB

_NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a number near 2**63


class MemoryPlanError(ConfigError):
    """The tables cannot fit the memory budget, even with every movable table on disk."""


def host_memory_limit() -> tuple[int, str]:
    """The memory this process may use on its host, and where that number came from."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"]
            candidates.append(Path("/sys/fs/cgroup/unified") / path.lstrip("/") / "memory.max")
        elif "memory" in controllers.split(","):
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"]
        else:
            continue
        for file in candidates:
            if file.is_file():
                text = file.read_text().strip()
                if text != "max" and int(text) < _NO_LIMIT:
                    return int(text), f"cgroup limit ({file})"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, "MemAvailable (/proc/meminfo)"
    raise OSError("no cgroup memory limit and no MemAvailable in /proc/meminfo")


def rank_budget(local_world_size: int, total_bytes: int | None = None) -> tuple[int, str]:
    """Each of the host's ``local_world_size`` ranks' share of ``total_bytes`` (default: the host limit)."""
    if local_world_size <= 0:
        raise ConfigError(f"local_world_size must be > 0, got {local_world_size}")
    source = "given"
    if total_bytes is None:
        total_bytes, source = host_memory_limit()
    return total_bytes // local_world_size, f"{source} / {local_world_size} ranks"


def table_bytes(table: BaseEmbeddingConfig, optimizer: FusedOptimizerConfig) -> int:
    """Rows and fused optimizer state of a whole table (what a disk table keeps in its files)."""
    element = 2 if table.data_type is DataType.FP16 else 4
    state = optimizer.state_floats_per_row(table.embedding_dim) * 4
    return table.num_embeddings * (table.embedding_dim * element + state)


@dataclass(frozen=True)
class TablePlacement:
    name: str
    storage: str  # "ram" or "disk"
    rank_bytes: int  # this table's share on one rank
    cache_bytes: int = 0  # disk: the page cache it is expected to get
    hit_rate: float | None = None  # disk, with id counts: expected share of lookups served from the cache


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    source: str
    fixed_bytes: int
    tables: tuple[TablePlacement, ...]

    def storage_of(self, name: str) -> str:
        return next(t.storage for t in self.tables if t.name == name)

    def apply(self, tables: Sequence[BaseEmbeddingConfig]) -> list[BaseEmbeddingConfig]:
        """``tables`` with each one's planned ``storage``."""
        return [dataclasses.replace(t, storage=self.storage_of(t.name)) for t in tables]

    def report(self) -> str:
        """One line for the budget, one per table: where it lives, its size per rank, cache and hit rate."""
        ram = sum(t.rank_bytes for t in self.tables if t.storage == "ram")
        lines = [
            f"memory per rank: budget {self.budget_bytes / GB:.2f} GB ({self.source}); fixed "
            f"{self.fixed_bytes / GB:.2f} GB, RAM tables {ram / GB:.2f} GB, disk caches "
            f"{sum(t.cache_bytes for t in self.tables) / GB:.2f} GB"
        ]
        for t in self.tables:
            line = f"  {t.name}: {t.storage}, {t.rank_bytes / GB:.3f} GB per rank"
            if t.storage == "disk":
                line += f", cache {t.cache_bytes / GB:.3f} GB"
                line += f", expected hit rate {t.hit_rate:.3f}" if t.hit_rate is not None else ""
            lines.append(line)
        return "\n".join(lines)


def _hit_rate(counts: np.ndarray, cached_rows: int) -> float:
    total = float(counts.sum())
    if total <= 0:
        return 1.0
    hottest = np.sort(counts)[::-1][: max(0, cached_rows)]
    return float(hottest.sum()) / total


def plan_memory(
    tables: Sequence[BaseEmbeddingConfig],
    optimizer: FusedOptimizerConfig,
    budget_bytes: int,
    *,
    world_size: int = 1,
    fixed_bytes: int = 0,
    id_counts: Mapping[str, Sequence[float] | np.ndarray] | None = None,
    min_cache_fraction: float = 0.05,
    source: str = "given",
) -> MemoryPlan:
    """Place ``tables`` in RAM or on disk within ``budget_bytes`` per rank (see the module doc).

    Args:
        fixed_bytes: what a rank needs besides the tables (interpreter, dense model, batches).
        id_counts: per table, lookups per row (e.g. training's hot-row statistics); tables without counts
            are ranked by size.
        min_cache_fraction: the least page cache a disk table is planned with, as a share of its size.
    """
    counts = {k: np.asarray(v, dtype=np.float64) for k, v in (id_counts or {}).items()}
    for name, c in counts.items():
        table = next((t for t in tables if t.name == name), None)
        if table is None or c.shape != (table.num_embeddings,):
            raise ConfigError(f"id_counts[{name!r}]: expected one count per row of a table of this model")
    share = {t.name: -(-table_bytes(t, optimizer) // world_size) for t in tables}
    lookups = {t.name: float(counts[t.name].sum()) if t.name in counts else None for t in tables}

    def heat(t: BaseEmbeddingConfig) -> tuple[int, float]:
        # Tables with counts first, by lookups per byte; then the rest, smallest first.
        n = lookups[t.name]
        return (0, -n / max(share[t.name], 1)) if n is not None else (1, float(share[t.name]))

    free = budget_bytes - fixed_bytes
    disk_floor = {t.name: int(min_cache_fraction * share[t.name]) for t in tables}
    storage: dict[str, str] = {}
    for t in sorted(tables, key=heat):
        if t.storage == "disk":
            storage[t.name] = "disk"
            continue
        # RAM if the table fits beside the least caches of the tables not yet in RAM.
        rest = sum(disk_floor[u.name] for u in tables if u.name not in storage and u.name != t.name)
        storage[t.name] = "ram" if share[t.name] + rest <= free else "disk"
        if storage[t.name] == "ram":
            free -= share[t.name]
    disk = [t for t in tables if storage[t.name] == "disk"]
    in_ram = sum(share[t.name] for t in tables if storage[t.name] == "ram")
    on_disk = sum(share[t.name] for t in disk)
    need = fixed_bytes + in_ram + sum(disk_floor[t.name] for t in disk)
    if need > budget_bytes:
        raise MemoryPlanError(
            f"the tables do not fit in memory even on disk: a rank needs {need / GB:.2f} GB (fixed "
            f"{fixed_bytes / GB:.2f} GB, RAM tables {in_ram / GB:.2f} GB, disk caches at "
            f"{min_cache_fraction:.0%} of {on_disk / GB:.2f} GB) but its budget is "
            f"{budget_bytes / GB:.2f} GB "
            f"({source})"
        )
    left = max(0, free)
    weights = {t.name: lookups[t.name] if lookups[t.name] is not None else float(share[t.name]) for t in disk}
    total_weight = sum(weights.values()) or 1.0
    placements = []
    for t in tables:
        if storage[t.name] == "ram":
            placements.append(TablePlacement(t.name, "ram", share[t.name]))
            continue
        cache = min(share[t.name], int(left * weights[t.name] / total_weight))
        hit = None
        if t.name in counts:
            row_bytes = share[t.name] * world_size / t.num_embeddings
            hit = _hit_rate(counts[t.name], int(cache * world_size / row_bytes))
        placements.append(TablePlacement(t.name, "disk", share[t.name], cache, hit))
    return MemoryPlan(budget_bytes, source, fixed_bytes, tuple(placements))


def check_disk_space(plan: MemoryPlan, directory: str | os.PathLike, world_size_on_host: int = 1) -> None:
    """Refuse a plan whose disk tables do not fit in ``directory``'s free space (all the host's ranks)."""
    need = sum(t.rank_bytes for t in plan.tables if t.storage == "disk") * world_size_on_host
    Path(directory).mkdir(parents=True, exist_ok=True)
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    if need > free:
        raise MemoryPlanError(
            f"disk tables need {need / GB:.2f} GB in {directory} but it has {free / GB:.2f} GB free"
        )
