"""Choose one sharding option per table: a few fixed proposals, then a bounded local search.

A proposal is a tuple of option indices, one per table (tables in the enumerator's order). Proposals are
scored by an ``evaluate`` callback (lower is better, ``None`` when the proposal does not fit). The search is
deterministic: it visits tables and options in order and stops after ``max_evaluations`` proposals.
"""

from __future__ import annotations

from collections.abc import Callable

from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.types import PLANNED_SHARDING_TYPES, ShardingType

Proposal = tuple[int, ...]
Score = tuple[float, int]


def total_perf(option: ShardingOption, world_size: int) -> float:
    """Seconds the option adds summed over ranks (a replicated table costs every rank)."""
    copies = world_size if option.sharding_type == ShardingType.DATA_PARALLEL else 1
    return sum(s.perf for s in option.shards) * copies


def max_shard_storage(option: ShardingOption) -> int:
    return max(s.storage for s in option.shards)


def _cheapest(opts: list[ShardingOption], indices: list[int], world_size: int) -> int:
    """Index of the option with the least total seconds (then the smallest shards, then the lowest index)."""
    return min(indices, key=lambda i: (total_perf(opts[i], world_size), max_shard_storage(opts[i]), i))


def best_perf_proposal(options: list[list[ShardingOption]], world_size: int) -> Proposal:
    """Every table takes its cheapest option in total seconds (then the smallest shards)."""
    return tuple(_cheapest(opts, list(range(len(opts))), world_size) for opts in options)


def memory_lean_proposal(options: list[list[ShardingOption]], world_size: int) -> Proposal:
    """Every table takes the option whose largest shard is smallest (the most likely to fit)."""
    return tuple(
        min(range(len(opts)), key=lambda i: (max_shard_storage(opts[i]), total_perf(opts[i], world_size), i))
        for opts in options
    )


def uniform_proposals(options: list[list[ShardingOption]], world_size: int) -> list[Proposal]:
    """One proposal per sharding type: every table that allows the type uses its cheapest option of it."""
    fallback = best_perf_proposal(options, world_size)
    proposals = []
    for sharding_type in PLANNED_SHARDING_TYPES:
        proposal = []
        for t, opts in enumerate(options):
            of_type = [i for i, o in enumerate(opts) if o.sharding_type == sharding_type]
            proposal.append(_cheapest(opts, of_type, world_size) if of_type else fallback[t])
        proposals.append(tuple(proposal))
    return proposals


def local_search(
    options: list[list[ShardingOption]],
    start: Proposal,
    evaluate: Callable[[Proposal], Score | None],
    max_evaluations: int,
) -> tuple[Proposal, Score | None]:
    """Coordinate descent: change one table's option at a time while the score improves.

    Infeasible proposals score worse than any feasible one, so an infeasible start walks towards a fit.
    """
    best, best_score = start, evaluate(start)
    evaluations, improved = 1, True
    while improved and evaluations < max_evaluations:
        improved = False
        for t, opts in enumerate(options):
            for i in range(len(opts)):
                if i == best[t] or evaluations >= max_evaluations:
                    continue
                candidate = best[:t] + (i,) + best[t + 1 :]
                score = evaluate(candidate)
                evaluations += 1
                if score is not None and (best_score is None or score < best_score):
                    best, best_score, improved = candidate, score, True
    return best, best_score
