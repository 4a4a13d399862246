"""Render a plan as a fixed-width table: per rank the shards placed, bytes and seconds, then the imbalance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from rectrain.planner.types import ParameterSharding, Shard, ShardingType


class PlanView(Protocol):
    """What the report reads of a ``plan.ShardingPlan`` (plan imports this module to render itself)."""

    @property
    def plan(self) -> Mapping[str, Mapping[str, ParameterSharding]]: ...

    @property
    def world_size(self) -> int: ...

    @property
    def local_world_size(self) -> int | None: ...


_SHORT = {
    ShardingType.DATA_PARALLEL: "DP",
    ShardingType.TABLE_WISE: "TW",
    ShardingType.ROW_WISE: "RW",
    ShardingType.COLUMN_WISE: "CW",
    ShardingType.TABLE_ROW_WISE: "TWRW",
}


def _per_rank(plan: PlanView) -> list[list[tuple[str, Shard]]]:
    """``(label, shard)`` of every shard on each rank; data-parallel shards appear on every rank."""
    placed: list[list[tuple[str, Shard]]] = [[] for _ in range(plan.world_size)]
    for module_path in sorted(plan.plan):
        for name in sorted(plan.plan[module_path]):
            sharding = plan.plan[module_path][name]
            fqn = f"{module_path}.{name}" if module_path else name
            for shard in sharding.sharding_spec:
                label = (
                    f"{fqn} {_SHORT[sharding.sharding_type]}/{sharding.compute_kernel.value} "
                    f"rows {shard.row_offset}:{shard.row_offset + shard.num_rows} "
                    f"cols {shard.col_offset}:{shard.col_offset + shard.num_cols}"
                )
                ranks = sharding.ranks if shard.rank is None else [shard.rank]
                for rank in ranks:
                    placed[rank].append((label, shard))
    return placed


def _imbalance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def format_report(plan: PlanView) -> str:
    """The report; shards without estimates (hand-edited) count as 0 and are marked ``?``."""
    placed = _per_rank(plan)
    storage = [sum(s.storage or 0 for _, s in shards) for shards in placed]
    perf = [sum(s.perf or 0.0 for _, s in shards) for shards in placed]
    unknown = any(s.storage is None or s.perf is None for shards in placed for _, s in shards)
    lines = [
        f"sharding plan: world_size {plan.world_size}, local_world_size {plan.local_world_size}",
        f"{'rank':>4}  {'memory_bytes':>16}  {'est_seconds':>12}  shards",
    ]
    for rank, shards in enumerate(placed):
        labels = [label + ("" if s.storage is not None else " ?") for label, s in shards] or ["(none)"]
        lines.append(f"{rank:>4}  {storage[rank]:>16,}  {perf[rank]:>12.6f}  {labels[0]}")
        lines.extend(f"{'':>4}  {'':>16}  {'':>12}  {label}" for label in labels[1:])
    memory_imbalance = _imbalance([float(s) for s in storage])
    lines.append(f"imbalance (max/mean): perf {_imbalance(perf):.3f}, memory {memory_imbalance:.3f}")
    if unknown:
        lines.append("? shard without estimates (edited by hand): counted as 0 bytes and 0 seconds")
    return "\n".join(lines)
