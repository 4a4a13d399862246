"""What the planner logs after a plan (TorchRec's ``Stats``, ``torchrec.distributed.planner.stats``).

:class:`EmbeddingStats` frames the plan's own report (``ShardingPlan.report()``: per rank the shards, bytes
and seconds) between the search's figures and TorchRec's summary lines (imbalance measures, the fullest rank,
how many tables had their kernel fixed by constraints); it keeps the lines in ``_stats_table`` and logs them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from rectrain.planner.protocols import Stats
from rectrain.planner.types import GIB

logger = logging.getLogger(__name__)

MIN_WIDTH = 90


def _normalize_float(p: list[float]) -> list[float]:
    total = sum(p)
    assert total > 0
    return [x / total for x in p]


_normalize_int = _normalize_float


def _total_variation(p: list[float]) -> float:
    """Largest distance of one share from the even share ``1/k``."""
    return max(abs(x - 1.0 / len(p)) for x in p)


def _total_distance(p: list[float]) -> float:
    return sum(abs(x - 1.0 / len(p)) for x in p)


def _chi_sq_divergence(p: list[float]) -> float:
    k = len(p)
    return sum(abs(x - 1.0 / k) ** 2.0 * k for x in p)


def _kl_divergence(p: list[float]) -> float:
    k = len(p)
    return sum(x * math.log(k * x) for x in p if x > 0)


def _calc_max_chi_sq_divergence(n: int) -> float:
    """The chi-square divergence of the most imbalanced distribution of ``n`` shares (all on one)."""
    return ((n - 1) / n) ** 2.0 * n + (n - 1) / n


def _calc_max_kl_divergence(n: int) -> float:
    return math.log(n)


def _normalized(measure: Callable[[list[float]], float], bound: Callable[[int], float]) -> Callable:
    def normalized(p: list[float]) -> float:
        top = bound(len(p))  # 0 for one rank: a single rank is balanced
        return measure(p) / top if top > 0 else 0.0

    return normalized


IMBALANCE_STAT_MEASURE: dict[str, Callable[[list[float]], float]] = {
    "Total Variation": _total_variation,
    "Total Distance": _total_distance,
    "Chi Divergence": _normalized(_chi_sq_divergence, _calc_max_chi_sq_divergence),
    "KL Divergence": _normalized(_kl_divergence, _calc_max_kl_divergence),
}


def _value(x: Any, memory: str) -> float:
    """A shard's estimate as a number: TorchRec's ``Perf``/``Storage`` or rectrain's seconds/bytes."""
    if x is None:
        return 0.0
    if memory:
        return float(getattr(x, memory, x))
    return float(getattr(x, "total", x))


class EmbeddingStats(Stats):
    """Logs the plan's report with the planner's figures around it (see the module doc)."""

    def __init__(self) -> None:
        self._width = MIN_WIDTH
        self._stats_table: list[str] = []

    def log(
        self,
        sharding_plan: Any,
        topology: Any,
        batch_size: int,
        storage_reservation: Any,
        num_proposals: int,
        num_plans: int,
        run_time: float,
        best_plan: list[Any],
        constraints: dict[str, Any] | None = None,
        sharders: list[Any] | None = None,
        enumerator: Any = None,
        debug: bool = True,
        debug_stats: Any = None,
    ) -> None:
        """Build ``_stats_table`` for ``sharding_plan`` and log it (``best_plan``: its placed options)."""
        memory = "hbm" if topology.compute_device != "cpu" else "ddr"
        perf, used = [0.0] * topology.world_size, [0.0] * topology.world_size
        for option in best_plan:
            replicated = str(option.sharding_type) == "data_parallel"
            for shard in option.shards:
                ranks = range(topology.world_size) if replicated or shard.rank is None else [shard.rank]
                for rank in ranks:
                    perf[rank] += _value(shard.perf, "")
                    used[rank] += _value(shard.storage, memory)
        body = [
            "--- Planner Statistics ---",
            f"--- Evaluated {num_proposals} proposal(s), found {num_plans} possible plan(s), "
            f"ran for {run_time:.2f}s ---",
            f"batch size {batch_size}, world size {topology.world_size}, compute device "
            f"{topology.compute_device}",
        ]
        report = getattr(sharding_plan, "report", None)
        if callable(report):
            body += ["", *report().splitlines()]
        self._width = max(MIN_WIDTH, *(len(line) + 4 for line in body))
        self._stats_table = ["#" * self._width, *(self._row(line) for line in body)]
        if debug and best_plan:
            self._imbalance(perf, used, memory)
            top = f"Top {memory.upper()} Memory Usage Estimation: {round(max(used) / GIB, 3)} GB"
            self._stats_table += [self._row(""), self._row(top)]
        self._kernel_constraints(best_plan, constraints)
        self._stats_table.append("#" * self._width)
        for row in self._stats_table:
            logger.info(row)

    def _row(self, text: str, indent: int = 1) -> str:
        pad = " " * indent
        return f"#{pad}{text: <{self._width - 2 - indent}}#"

    def _imbalance(self, perf: list[float], used: list[float], memory: str) -> None:
        self._stats_table += [self._row(""), self._row("Imbalance Statistics:")]
        for name, values in (("Total Perf", perf), (f"{memory.upper()} Memory", used)):
            if sum(values) <= 0:
                continue
            shares = _normalize_float(values)
            measures = ", ".join(f"{m}: {f(shares):.3f}" for m, f in IMBALANCE_STAT_MEASURE.items())
            self._stats_table.append(self._row(f"{name}: {measures}", indent=4))

    def _kernel_constraints(self, best_plan: list[Any], constraints: dict[str, Any] | None) -> None:
        """How many tables had their kernel fixed by constraints, and which kernels."""
        fixed: dict[str, int] = {}
        for option in best_plan:
            constraint = (constraints or {}).get(option.name)
            if constraint is not None and constraint.compute_kernels:
                kernel = str(option.compute_kernel)
                fixed[kernel] = fixed.get(kernel, 0) + 1
        auto = len(best_plan) - sum(fixed.values())
        self._stats_table += [self._row(""), self._row("Compute Kernel Constraints:")]
        self._stats_table.append(self._row(f"Hardcoded: {sum(fixed.values())}, Auto-selected: {auto}", 4))
        self._stats_table += [self._row(f"Hardcoded {k}: {n}", 4) for k, n in sorted(fixed.items())]


class NoopEmbeddingStats(Stats):
    """Logs nothing."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass
