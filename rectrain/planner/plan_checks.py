"""Checks of a plan against the model and of placed options, and the merge of a loaded plan into a search
space (TorchRec's ``validate_compute_kernels``, ``validate_modules_inclusion_in_sharding_plan`` and
``extract_plan``, ``torchrec.distributed.planner.planners``, and its ``PlanLoader`` interface)."""

from __future__ import annotations

import abc
import copy
from collections import deque
from typing import Any

from torch import nn

from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.sharder_data import sharder_name
from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.types import EmbeddingComputeKernel

_KERNELS = {k.value for k in EmbeddingComputeKernel}
_CACHING = {EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.QUANT_UVM_CACHING.value}


def validate_compute_kernels(best_plan: list[ShardingOption]) -> None:
    """Raise :class:`PlannerError` listing every option whose kernel is unknown or contradicts the rest
    of the option (``dense`` off data parallel, a cache load factor outside (0, 1), negative storage)."""
    violations = []
    for option in best_plan:
        fqn, kernel = option.fqn, str(option.compute_kernel)
        if kernel not in _KERNELS:
            violations.append(f"{fqn}: unknown compute kernel '{kernel}'")
            continue
        if kernel == EmbeddingComputeKernel.DENSE.value and str(option.sharding_type) != "data_parallel":
            violations.append(
                f"{fqn}: DENSE kernel requires DATA_PARALLEL sharding, got '{option.sharding_type}'"
            )
        clf = option.cache_load_factor
        if kernel in _CACHING and clf is not None and not 0 < clf < 1:
            violations.append(
                f"{fqn}: {kernel} requires cache_load_factor strictly between 0 and 1, got {clf}"
            )
        for memory in ("hbm", "ddr"):  # rectrain's own options carry plain bytes: checked once, as DDR
            used = sum(
                getattr(sh.storage, memory, sh.storage if memory == "ddr" else 0) or 0 for sh in option.shards
            )
            if used < 0:
                violations.append(f"{fqn}: {kernel} has negative {memory.upper()} storage ({used})")
    if violations:
        raise PlannerError(
            f"Compute kernel validation failed with {len(violations)} violation(s):\n"
            + "\n".join(f"  - {v}" for v in violations),
            PlannerErrorType.INVALID_COMPUTE_KERNEL,
        )


def validate_modules_inclusion_in_sharding_plan(
    sharding_plan: Any,
    module: nn.Module,
    sharders: list[Any],
    constraints: dict[str, Any] | None = None,
    device_group: str | None = None,
) -> None:
    """Raise :class:`PlannerError` when a module a sharder shards (with parameters to shard, and in
    ``device_group`` when given) has no entry in ``sharding_plan``."""
    if device_group is not None and constraints is None:
        raise ValueError("device_group is set but constraints is None: the group is read from constraints")
    sharder_map = {sharder_name(s.module_type): s for s in sharders}
    expected, queue = set(), deque([("", module)])
    while queue:
        path, child = queue.popleft()
        sharder = sharder_map.get(sharder_name(type(child)))
        params = sharder.shardable_parameters(child) if sharder else {}
        if params:
            if device_group is None or any(
                name in constraints and constraints[name].device_group == device_group for name in params
            ):
                expected.add(path)
            continue  # a sharded module's children are its own business
        queue.extend((f"{path}.{name}" if path else name, sub) for name, sub in child.named_children())
    missing = sorted(expected - set(sharding_plan.plan))
    if missing:
        group = f" for device group '{device_group}'" if device_group else ""
        raise PlannerError(
            f"The following shardable modules are not present in the sharding plan{group}: {missing}.",
            PlannerErrorType.MISSING_MODULE_IN_PLAN,
        )


class PlanLoader(abc.ABC):
    """Where a stored plan comes from: its options keyed by ``ShardingOption.storage_hash()``, and the hash
    of the planner inputs it was made for."""

    @abc.abstractmethod
    def load(self) -> dict[int, ShardingOption] | None: ...

    @abc.abstractmethod
    def plan_context_hash(self) -> str: ...

    def get_plan_id(self) -> str | None:
        return None


def extract_plan(
    search_space: list[ShardingOption], loaded_sharding_options: dict[int, ShardingOption]
) -> list[ShardingOption]:
    """The options of ``search_space`` a loaded plan chose (keyed by ``storage_hash()``), each with the
    loaded option's shards; a loaded option the search space does not hold is an error."""
    merged, seen = [], set()
    for option in search_space:
        key = option.storage_hash()
        if key in seen:
            fqns = [o.fqn for o in search_space]
            raise PlannerError(
                f"Found a duplicate storage hash {key} for FQNs {fqns}", PlannerErrorType.PLAN_LOADING_FAILED
            )
        seen.add(key)
        loaded = loaded_sharding_options.get(key)
        if loaded is not None:
            merged.append(copy.copy(option).with_shards(loaded.shards))
    if len(merged) != len(loaded_sharding_options):
        raise PlannerError(
            "Loaded sharding options from Storage, but not all search space is covered: merged search space "
            f"has {len(merged)} options, the loaded plan {len(loaded_sharding_options)}",
            PlannerErrorType.PLAN_LOADING_FAILED,
        )
    return merged
