"""Choose one sharding option per table.

rectrain's planner (``rectrain.planner.planner``) searches with the functions at the top: a proposal is a
tuple of option indices, one per table (tables in the enumerator's order), scored by an ``evaluate``
callback (lower is better, ``None`` when the proposal does not fit); a few fixed proposals, then a bounded,
deterministic coordinate descent that stops after ``max_evaluations`` proposals.

TorchRec's proposer objects (``torchrec.distributed.planner.proposers``) follow, for TorchRec's enumerator
records. A proposer is loaded with a search space (every table's options, estimated: ``Shard.perf`` is a
``Perf``, ``Shard.storage`` a ``Storage``), then alternates ``propose()`` (one option per table, or None
when done) and ``feedback(partitionable, plan, perf_rating, storage_constraint)`` about the last proposal.

- :class:`GreedyProposer`: every table's options sorted by perf (the slowest shard, or with
  ``use_depth=False`` the sum); starts with every table's best and then advances the table whose current
  option needs the most HBM (then DDR). ``threshold``: stop after that many proposals worse than the best.
- :class:`UniformProposer`: one proposal per sharding type that every table has, each table's best of it.
- :class:`GridSearchProposer`: every combination, when there are at most ``max_proposals``.
- :class:`DynamicProgrammingProposer`: after a first proposal (every table's leanest option), the plans of
  least total perf for each total HBM (binned, ``hbm_bins_per_device`` bins per device), largest first.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

from rectrain.planner.protocols import Proposer
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


logger = logging.getLogger(__name__)

MAX_PROPOSALS = 10_000
Options = list[ShardingOption]  # a TorchRec proposal: one option per table


def _sharding_option_score(option: ShardingOption, use_depth: bool = True) -> float:
    perfs = [shard.perf.total for shard in option.shards]
    return max(perfs) if use_depth else sum(perfs)


def _by_fqn(search_space: list[ShardingOption]) -> dict[str, list[ShardingOption]]:
    grouped: dict[str, list[ShardingOption]] = {}
    for option in search_space:
        grouped.setdefault(option.fqn, []).append(option)
    return grouped


class GreedyProposer(Proposer):
    """Best options first, then one table at a time to its next option (module doc)."""

    def __init__(self, use_depth: bool = True, threshold: int | None = None) -> None:
        self._use_depth = use_depth
        self._threshold = threshold or None
        self._sharding_options_by_fqn: dict[str, list[ShardingOption]] = {}
        self._current_proposal: dict[str, int] = {}
        self._best_perf_rating = float("inf")
        self._num_inferior_perf = 0

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        self._sharding_options_by_fqn = _by_fqn(search_space)
        for options in self._sharding_options_by_fqn.values():
            options.sort(key=lambda o: _sharding_option_score(o, self._use_depth))
        self._current_proposal = dict.fromkeys(self._sharding_options_by_fqn, 0)

    def propose(self) -> Options | None:
        if not self._current_proposal:
            return None
        return [self._sharding_options_by_fqn[fqn][i] for fqn, i in self._current_proposal.items()]

    def feedback(
        self,
        partitionable: bool,
        plan: Options | None = None,
        perf_rating: float | None = None,
        storage_constraint: Any = None,
    ) -> None:
        if self._threshold and perf_rating:
            self._num_inferior_perf += 1
            if perf_rating < self._best_perf_rating:
                self._best_perf_rating, self._num_inferior_perf = perf_rating, 0
            if self._num_inferior_perf > self._threshold:
                self._current_proposal = {}
                return
        largest, largest_storage = None, (0, 0, 0, 0)
        for fqn, options in self._sharding_options_by_fqn.items():
            index = self._current_proposal[fqn]
            if index + 1 < len(options):
                storages = [s.storage for s in options[index].shards]
                hbm, ddr = [s.hbm for s in storages], [s.ddr for s in storages]
                storage = (max(hbm), sum(hbm), max(ddr), sum(ddr))
                if storage > largest_storage:
                    largest, largest_storage = fqn, storage
        if largest is None:
            self._current_proposal = {}
        else:
            self._current_proposal[largest] += 1


class _ListProposer(Proposer):
    """Proposes ``_proposals`` in order, one per feedback."""

    _proposals: list[Options]

    def propose(self) -> Options | None:
        return self._proposals[self._proposal_index] if self._proposal_index < len(self._proposals) else None

    def feedback(
        self, partitionable: bool, plan: Any = None, perf_rating: Any = None, storage_constraint: Any = None
    ) -> None:
        self._proposal_index += 1


class UniformProposer(_ListProposer):
    """One proposal per sharding type that every table offers (module doc)."""

    def __init__(self, use_depth: bool = True) -> None:
        self._use_depth = use_depth
        self._proposals, self._proposal_index = [], 0

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        fqns = set(_by_fqn(search_space))
        by_type: dict[str, list[ShardingOption]] = {}
        for option in search_space:
            by_type.setdefault(str(option.sharding_type), []).append(option)
        self._proposals, self._proposal_index = [], 0
        for options in by_type.values():
            per_table = _by_fqn(options)
            if set(per_table) == fqns:
                score = lambda x: _sharding_option_score(x, self._use_depth)  # noqa: E731
                self._proposals.append([min(o, key=score) for o in per_table.values()])


class GridSearchProposer(_ListProposer):
    """Every combination of the tables' options, if there are at most ``max_proposals`` (module doc)."""

    def __init__(self, max_proposals: int = MAX_PROPOSALS) -> None:
        self._max_proposals = max_proposals
        self._proposals, self._proposal_index = [], 0

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        per_table = list(_by_fqn(search_space).values())
        for options in per_table:
            options.sort(key=_sharding_option_score)
        self._proposals, self._proposal_index = [], 0
        total = math.prod(len(o) for o in per_table)
        if total > self._max_proposals:
            logger.info("grid search skipped: %d proposals, at most %d allowed", total, self._max_proposals)
            return
        self._proposals = [list(combination) for combination in itertools.product(*per_table)]


class DynamicProgrammingProposer(Proposer):
    """Least total perf for each total HBM, by dynamic programming over binned HBM (module doc)."""

    def __init__(self, hbm_bins_per_device: int = 100) -> None:
        self._hbm_bins_per_device = max(hbm_bins_per_device, 1)
        self._sharding_options_by_fqn: dict[str, list[ShardingOption]] = {}
        self._proposal_list: list[list[int]] = []
        self._current_proposal = -1
        self._inited = False

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        self._sharding_options_by_fqn = _by_fqn(sorted(search_space, key=lambda o: o.total_storage.hbm))
        self._proposal_list, self._current_proposal = [], -1

    def propose(self) -> Options | None:
        options = list(self._sharding_options_by_fqn.values())
        if not self._inited:
            return [o[0] for o in options]
        if self._current_proposal < 0:
            return None
        return [o[i] for o, i in zip(options, self._proposal_list[self._current_proposal])]

    def feedback(
        self, partitionable: bool, plan: Any = None, perf_rating: Any = None, storage_constraint: Any = None
    ) -> None:
        if self._inited:
            self._current_proposal += 1
            if self._current_proposal >= len(self._proposal_list):
                self._current_proposal = -1
            return
        self._inited = True
        assert storage_constraint is not None, "the first feedback needs the storage constraint"
        bins = self._hbm_bins_per_device * len(storage_constraint.devices)
        bin_size = sum(d.storage.hbm for d in storage_constraint.devices) / bins
        tables = list(self._sharding_options_by_fqn.values())
        # best[b] = (perf, hbm in bins, indices) of the cheapest choice so far whose HBM falls in bin b
        best: dict[int, tuple[float, float, list[int]]] = {}
        for t, options in enumerate(tables):
            nxt: dict[int, tuple[float, float, list[int]]] = {}
            starts = sorted(best.items()) if t else [(0, (0.0, 0.0, []))]
            for j, option in enumerate(options):
                hbm, perf = option.total_storage.hbm / bin_size, option.total_perf
                for _, (prev_perf, prev_hbm, chosen) in starts:
                    total = prev_hbm + hbm
                    if total < bins and (int(total) not in nxt or nxt[int(total)][0] > prev_perf + perf):
                        nxt[int(total)] = (prev_perf + perf, total, [*chosen, j])
            best = nxt
        self._proposal_list = [best[b][2] for b in sorted(best, reverse=True)]
        self._current_proposal = 0 if self._proposal_list else -1


def proposers_to_proposals_list(
    proposers_list: list[Any], search_space: list[ShardingOption]
) -> list[Options]:
    """Every distinct proposal of proposers whose path ignores feedback, in order."""
    proposals, seen = [], set()
    for proposer in proposers_list:
        proposer.load(search_space=search_space)
    for proposer in proposers_list:
        proposal = proposer.propose()
        while proposal:
            key = tuple(sorted(map(hash, proposal)))
            proposer.feedback(partitionable=True)
            if key not in seen:
                proposals.append(proposal)
                seen.add(key)
            proposal = proposer.propose()
    return proposals
