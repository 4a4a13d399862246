"""``EmbeddingShardingPlanner``: enumerate options, estimate them, search placements, return the best plan.

The order of work (``plan``):
1. collect the tables of every module and check names and constraints;
2. enumerate every legal sharding option per table and estimate each shard's bytes and seconds;
3. drop options with a shard larger than any rank's memory (a table too big for one rank is thereby split);
4. partition a few proposals (cheapest per table, one uniform per sharding type, leanest in memory) and
   improve the best with a bounded local search; a memory-balanced placement of the leanest options is the
   fallback;
5. keep the placement with the lowest (slowest rank's seconds, fullest rank's bytes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rectrain.embedding.config import BaseEmbeddingConfig, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.context_hash import hash_planner_context_inputs, hash_planner_context_inputs_str
from rectrain.planner.enumerate import EmbeddingEnumerator
from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.partition import PartitionFailure, Placement, partition
from rectrain.planner.perf import estimate_perf
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.plan_checks import extract_plan
from rectrain.planner.proposers import (
    Proposal,
    Score,
    best_perf_proposal,
    local_search,
    memory_lean_proposal,
    uniform_proposals,
)
from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.stats import EmbeddingStats
from rectrain.planner.storage import estimate_storage
from rectrain.planner.tables import collect_tables, sharded_tables
from rectrain.planner.topology import Topology
from rectrain.planner.types import PLANNED_SHARDING_TYPES, ParameterSharding, ShardingType

logger = logging.getLogger(__name__)

# A storage rule: bytes of every shard of an option, in shard order (the plug for another kind of memory).
StorageEstimator = Callable[[ShardingOption, Topology, FusedOptimizerConfig], list[int]]
BATCH_SIZE = 512  # per-rank batch size assumed when none is given (TorchRec's default)


class EmbeddingShardingPlanner:
    """Plans how to shard embedding tables over a topology (``torchrec.distributed.planner``'s planner).

    ``constraints`` maps table names to :class:`ParameterConstraints`. ``storage_reservation`` (TorchRec's
    ``StorageReservation``, e.g. ``rectrain.planner.reservations.HeuristicalStorageReservation``) lowers every
    rank's memory before planning; default: none. ``stats`` (one or a list of TorchRec's ``Stats``, default
    :class:`~rectrain.planner.stats.EmbeddingStats`) log each plan; ``debug`` adds their imbalance lines.
    ``fused_optimizer`` sizes the optimizer state. ``max_search_evaluations`` bounds the local search
    (placements tried), and so planning time. ``storage_estimator(option, topology, optimizer)`` gives each
    shard's bytes in the memory the topology bounds (``Topology.capacity``); default: rectrain's measured
    rule, ``storage.estimate_storage`` (TorchRec's: ``shard_estimators.estimate_storage_torchrec``).
    ``enumerator`` may be an :class:`EmbeddingEnumerator` (the one
    enumerator; its ``last_stored_search_space`` is part of the context hash) and ``performance_model`` a
    ``NoopPerfModel`` (the slowest rank's seconds: the first key of the search's score). ``plan_loader``
    (TorchRec's ``PlanLoader``) supplies a stored plan: when its context hash equals
    :meth:`hash_planner_context_inputs_str` its options are the plan, else planning fails with
    ``PLANNER_INPUT_CONTEXT_MISMATCH``. TorchRec's ``proposer``, ``partitioner``, ``callbacks``,
    ``timeout_seconds``, other enumerators and performance models are refused when given: the search is
    rectrain's (module doc).
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Any = None,
        storage_reservation: Any = None,
        proposer: Any = None,
        partitioner: Any = None,
        performance_model: Any = None,
        stats: Any = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        debug: bool = True,
        callbacks: list | None = None,
        timeout_seconds: int | None = None,
        plan_loader: Any = None,
        *,
        fused_optimizer: FusedOptimizerConfig | None = None,
        max_search_evaluations: int = 256,
        storage_estimator: StorageEstimator = estimate_storage,
    ) -> None:
        from rectrain.distributed.planner.perf_models import NoopPerfModel

        given = {
            "enumerator": None if type(enumerator) is EmbeddingEnumerator else enumerator,
            "proposer": proposer, "partitioner": partitioner, "callbacks": callbacks,
            "performance_model": None if type(performance_model) is NoopPerfModel else performance_model,
            "timeout_seconds": timeout_seconds,
        }  # fmt: skip
        refused = sorted(name for name, value in given.items() if value)
        if refused:
            raise ConfigError(
                f"EmbeddingShardingPlanner({', '.join(refused)}=...): rectrain's planner searches with its "
                "own proposals and partitioner (rectrain.planner.planner); it takes topology, batch_size, "
                "an EmbeddingEnumerator, storage_reservation, a NoopPerfModel, stats, constraints, debug, "
                "plan_loader, fused_optimizer, max_search_evaluations and storage_estimator"
            )
        if topology is None:
            topology = _default_topology()
        batch_size = BATCH_SIZE if batch_size is None else batch_size
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        if max_search_evaluations < 1:
            raise ConfigError(f"max_search_evaluations must be >= 1, got {max_search_evaluations}")
        self._topology = topology
        self._batch_size = batch_size
        self._constraints = dict(constraints or {})
        self._optimizer = fused_optimizer or FusedOptimizerConfig()
        self._max_evaluations = max_search_evaluations
        self._storage_estimator = storage_estimator
        self._storage_reservation = storage_reservation
        self._stats = [EmbeddingStats()] if stats is None else (stats if isinstance(stats, list) else [stats])
        self._debug = debug
        self._enumerator = enumerator or EmbeddingEnumerator(topology, batch_size)
        self._plan_loader = plan_loader
        # The last plan's search, as TorchRec's planner keeps it.
        self._num_proposals = self._num_plans = 0
        self._best_plan: list[ShardingOption] | None = None

    @property
    def topology(self) -> Topology:
        return self._topology

    def hash_planner_context_inputs(self) -> int:
        """A hash of the topology, batch size, enumerated search space, storage reservation and constraints:
        what a stored plan must have been made from to be reused (TorchRec's)."""
        return hash_planner_context_inputs(
            self._topology, self._batch_size, self._enumerator, self._storage_reservation, self._constraints
        )

    def hash_planner_context_inputs_str(self) -> str:
        """:meth:`hash_planner_context_inputs` as a hex string (what a ``PlanLoader`` stores)."""
        return hash_planner_context_inputs_str(
            self._topology, self._batch_size, self._enumerator, self._storage_reservation, self._constraints
        )

    def plan(
        self, module: nn.Module | dict[str, list[BaseEmbeddingConfig]], sharders: list | None = None
    ) -> ShardingPlan:
        """Plan every table of ``module`` (a module to scan, or ``{module_path: [table configs]}``).

        ``sharders`` (TorchRec's argument) restricts the sharding types to those the sharders offer
        (``sharder.sharding_types(compute_device)``; types rectrain does not have are ignored), on top of
        the tables' ``ParameterConstraints``. None or empty: no restriction.
        """
        start = time.perf_counter()
        self._num_proposals = self._num_plans = 0
        self._best_plan = None
        if isinstance(module, nn.Module) and sharders is not None:
            sharded = sharded_tables(module, sharders)
            if not sharded:
                return ShardingPlan({})  # nothing the sharders shard (TorchRec's empty plan)
        tables = collect_tables(sharded if isinstance(module, nn.Module) and sharders is not None else module)
        known = {t.name for configs in tables.values() for t in configs}
        unknown = sorted(set(self._constraints) - known)
        if unknown:
            raise ConfigError(
                f"constraints name tables that do not exist: {unknown}; tables: {sorted(known)}"
            )
        self._storage_constraint = self._topology
        if self._storage_reservation is not None:
            self._storage_constraint = self._storage_reservation.reserve(
                topology=self._topology, batch_size=self._batch_size, module=module,
                sharders=sharders or [], constraints=self._constraints,
            )  # fmt: skip
        offered = _sharder_types(sharders, self._topology.compute_device)
        options = [
            [self._estimate(o) for o in opts]
            for opts in self._enumerator.enumerate_tables(tables, self._constraints, offered)
        ]
        loaded = self._load_plan([o for opts in options for o in opts])
        if loaded:
            self._best_plan = loaded
        else:
            self._best_plan = self._search([self._drop_oversized(opts) for opts in options]).options
        plan = _to_plan(self._best_plan, tables, self._topology)
        for stats in self._stats:
            stats.log(
                sharding_plan=plan, topology=self._topology, batch_size=self._batch_size,
                storage_reservation=self._storage_reservation, num_proposals=self._num_proposals,
                num_plans=self._num_plans, run_time=time.perf_counter() - start, best_plan=self._best_plan,
                constraints=self._constraints, sharders=sharders, debug=self._debug,
            )  # fmt: skip
        return plan

    def collective_plan(
        self,
        module: nn.Module | dict[str, list[BaseEmbeddingConfig]],
        sharders: list | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 of ``pg`` and broadcast the plan's JSON so every rank uses the same plan.

        Without an initialised ``torch.distributed`` this is :meth:`plan`. A planning error on rank 0 is
        broadcast too and raised on every rank, so no rank hangs.
        """
        if not (dist.is_available() and dist.is_initialized()):
            return self.plan(module, sharders)
        payload: list[str | None] = [None]
        if dist.get_rank(pg) == 0:
            try:
                payload[0] = self.plan(module, sharders).to_json()
            except (PlannerError, ConfigError) as e:
                payload[0] = json.dumps({"error": f"{type(e).__name__}: {e}"})
        from rectrain.distributed.comm.timeouts import collective

        with collective("broadcast (sharding plan)", pg):
            dist.broadcast_object_list(payload, group=pg, group_src=0)
        data = json.loads(payload[0])
        if "error" in data:
            raise PlannerError(f"planning failed on rank 0: {data['error']}")
        return ShardingPlan.from_dict(data)

    def _load_plan(self, search_space: list[ShardingOption]) -> list[ShardingOption]:
        """The plan loader's options merged into ``search_space`` ([] without a loader or a stored plan);
        a stored plan made from other inputs is refused, as TorchRec's planner does."""
        if self._plan_loader is None:
            return []
        current, stored = self.hash_planner_context_inputs_str(), self._plan_loader.plan_context_hash()
        if current != stored:
            raise PlannerError(
                f"planner input mismatch: the stored plan was made for context hash {stored}, this planner's "
                f"inputs hash to {current}",
                PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH,
            )
        loaded = self._plan_loader.load()
        if loaded is None:
            return []
        logger.info("using the stored plan %s, no search", self._plan_loader.get_plan_id())
        return extract_plan(search_space, loaded)

    def _estimate(self, option: ShardingOption) -> ShardingOption:
        storage = self._storage_estimator(option, self._topology, self._optimizer)
        perf = estimate_perf(option, self._topology, self._optimizer)
        shards = [dataclasses.replace(s, storage=b, perf=t) for s, b, t in zip(option.shards, storage, perf)]
        return option.with_shards(shards)

    def _drop_oversized(self, options: list[ShardingOption]) -> list[ShardingOption]:
        """Options whose every shard fits some rank it may go to, on an empty topology."""
        caps = [self._storage_constraint.capacity(r) for r in range(self._topology.world_size)]

        def fits(option: ShardingOption) -> bool:
            if option.sharding_type == ShardingType.DATA_PARALLEL:
                return option.shards[0].storage <= min(caps)
            if option.sharding_type == ShardingType.ROW_WISE:
                return all(s.storage <= caps[s.rank] for s in option.shards)
            return all(s.storage <= max(caps) for s in option.shards)

        kept = [o for o in options if fits(o)]
        if not kept:
            leanest = min(options, key=lambda o: max(s.storage for s in o.shards))
            needed = max(s.storage for s in leanest.shards)
            raise self._no_fit_error(leanest, needed, caps, _total_storage([leanest], len(caps)))
        return kept

    def _search(self, options: list[list[ShardingOption]]) -> Placement:
        world = self._topology.world_size
        placements: dict[Proposal, Placement | PartitionFailure] = {}

        def evaluate(proposal: Proposal) -> Score | None:
            if proposal not in placements:
                chosen = [opts[i] for opts, i in zip(options, proposal)]
                placements[proposal] = partition(chosen, self._storage_constraint, "perf")
            result = placements[proposal]
            return result.score if isinstance(result, Placement) else None

        lean = memory_lean_proposal(options, world)
        proposals = [best_perf_proposal(options, world), *uniform_proposals(options, world), lean]
        scored = [(s, i, p) for i, p in enumerate(proposals) if (s := evaluate(p)) is not None]
        start = min(scored)[2] if scored else proposals[0]
        best, best_score = local_search(options, start, evaluate, self._max_evaluations)
        lean_options = [opts[i] for opts, i in zip(options, lean)]
        memory_balanced = partition(lean_options, self._storage_constraint, "memory")
        self._num_proposals = len(placements) + 1  # and the memory-balanced placement
        self._num_plans = sum(isinstance(p, Placement) for p in placements.values())
        self._num_plans += isinstance(memory_balanced, Placement)
        candidates = [placements[best]] if best_score is not None else []
        if isinstance(memory_balanced, Placement):
            candidates.append(memory_balanced)
        if not candidates:
            assert isinstance(memory_balanced, PartitionFailure)
            failure, total = memory_balanced, _total_storage(lean_options, world)
            raise self._no_fit_error(failure.option, failure.needed, failure.free, total)
        return min(candidates, key=lambda p: p.score)

    def _no_fit_error(self, option: ShardingOption, needed: int, free: list[int], total: int) -> PlannerError:
        """Why ``option`` found no rank: INSUFFICIENT_STORAGE when the leanest choice (``total`` bytes)
        exceeds the whole world's memory, else STRICT_CONSTRAINTS (TorchRec's classification)."""
        table = option.table
        weight_bytes = table.num_embeddings * table.embedding_dim * table.data_type.bits // 8
        shortfall = ", ".join(
            f"rank {rank}: {room:,} free, short {max(0, needed - room):,}" for rank, room in enumerate(free)
        )
        insufficient = total > sum(free)
        return PlannerError(
            f"cannot place table {table.name!r} of module {option.path!r} ({table.num_embeddings} x "
            f"{table.embedding_dim} {table.data_type.value}, {weight_bytes:,} bytes of weights): its "
            f"smallest shard ({option.sharding_type.value}) needs {needed:,} bytes with optimizer state and "
            f"buffers; per rank: {shortfall}{_reserved(self._storage_reservation)}. Add ranks, raise "
            "ddr_cap/hbm_cap, lower the batch size, or allow more sharding types in the table's "
            "ParameterConstraints",
            PlannerErrorType.INSUFFICIENT_STORAGE if insufficient else PlannerErrorType.STRICT_CONSTRAINTS,
        )


def _sharder_types(sharders: list | None, compute_device: str) -> list[ShardingType] | None:
    """The sharding types TorchRec-style ``sharders`` offer together; None when none is given."""
    if not sharders:
        return None
    offered: list[ShardingType] = []
    for sharder in sharders:
        method = getattr(sharder, "sharding_types", None)
        if not callable(method):
            raise ConfigError(
                f"sharders: a {type(sharder).__name__} has no sharding_types(compute_device_type) method"
            )
        known = {t.value: t for t in PLANNED_SHARDING_TYPES}  # TorchRec-only types are never planned
        offered += [
            known[str(v)] for v in method(compute_device) if str(v) in known and known[str(v)] not in offered
        ]
    return offered


def _default_topology() -> Topology:
    """The running job's world (``LOCAL_WORLD_SIZE`` as torchrun sets it), or a single cpu/cuda rank."""
    if not (dist.is_available() and dist.is_initialized()):
        world, local = 1, None
    else:
        world = dist.get_world_size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Topology(world_size=world, compute_device=device, local_world_size=local)


def _total_storage(options: list[ShardingOption], world_size: int) -> int:
    """Bytes the options need over all ranks (a data-parallel table once per rank)."""
    copies = [world_size if o.sharding_type == ShardingType.DATA_PARALLEL else 1 for o in options]
    return sum(n * sum(s.storage for s in o.shards) for n, o in zip(copies, options))


def _reserved(reservation: Any) -> str:
    """What a storage reservation kept back, for an error message ('' for none)."""
    if reservation is None:
        return ""
    name = type(reservation).__name__
    if getattr(reservation, "_hbm_bytes", 0):
        return f" (after {name} kept {reservation._hbm_bytes / 1024**3:g} GB per device)"
    return f" (after {name} kept {getattr(reservation, '_percentage', 0):.0%} of every device's memory)"


def _to_plan(
    options: list[ShardingOption], tables: dict[str, list[BaseEmbeddingConfig]], topology: Topology
) -> ShardingPlan:
    plan: dict[str, dict[str, ParameterSharding]] = {path: {} for path in sorted(tables)}
    for option in options:
        if option.sharding_type == ShardingType.DATA_PARALLEL:
            ranks = list(range(topology.world_size))
        else:
            ranks = [s.rank for s in option.shards]
        plan[option.path][option.name] = ParameterSharding(
            option.sharding_type, option.compute_kernel, ranks, list(option.shards), option.cache_params,
            option.enforce_hbm, option.stochastic_rounding, option.bounds_check_mode,
        )  # fmt: skip
    shapes = {
        path: {t.name: (t.num_embeddings, t.embedding_dim) for t in sorted(configs, key=lambda t: t.name)}
        for path, configs in sorted(tables.items())
    }
    return ShardingPlan(plan, topology.world_size, shapes, topology.local_world_size)
