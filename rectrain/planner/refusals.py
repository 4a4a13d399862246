"""TorchRec planner names rectrain does not have, each refused by name with what to use instead.

rectrain's planner searches proposals and placements inside ``EmbeddingShardingPlanner.plan`` (its
proposers and partitioner are ``rectrain.planner.proposers`` and ``rectrain.planner.partition``) and reports
the plan with ``ShardingPlan.report()``; TorchRec's swappable components and their tuning searches are not
separate objects here. A module at a TorchRec path sets ``__getattr__ = refusing_getattr(__name__)``.
"""

from __future__ import annotations

from collections.abc import Callable

from rectrain.errors import RecTrainError

_PLAN = (
    "plan with rectrain.planner.EmbeddingShardingPlanner(topology, batch_size, constraints=...)"
    ".plan(module, sharders), which proposes and partitions itself, and read plan.report()"
)
_COMPONENT = "is a swappable TorchRec planner component"
_P = "rectrain.distributed.planner."


def _each(names: str, why: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), why)


_WHY = {
    _P + "planners": {
        "extract_plan": "loads a stored plan into the search space; load it with ShardingPlan.from_json",
        "validate_compute_kernels": "checks kernels against sharders; the planner offers only those it runs",
        "validate_modules_inclusion_in_sharding_plan": "checks a plan covers the model; DMP checks this",
        "EmbeddingPlannerBase": _COMPONENT,
        "to_sharding_plan": "turns placed options into a plan; the planner returns a ShardingPlan",
    },
    _P + "proposers": _each(
        "GreedyProposer UniformProposer GridSearchProposer DynamicProgrammingProposer "
        "EmbeddingOffloadScaleupProposer proposers_to_proposals_list",
        _COMPONENT,
    ),
    _P + "partitioners": _each(
        "GreedyPerfPartitioner MemoryBalancedPartitioner OrderedDeviceHardware", _COMPONENT
    ),
    _P + "stats": _each("EmbeddingStats NoopEmbeddingStats", "formats TorchRec's report; use plan.report()"),
    _P + "estimator": {"EmbeddingPerfEstimatorFactory": "builds TorchRec's perf estimators; " + _COMPONENT},
    _P + "types": _each(
        "PlanLoader Stats PlanDebugStats CriticalPathEstimate",
        "describes TorchRec's plan loading and stats; rectrain's plan is ShardingPlan (to_json / from_json, "
        "report())",
    ),
}


class PlannerApiRefused(RecTrainError, NotImplementedError):
    """A TorchRec planner name rectrain does not have."""


def refusing_getattr(module: str) -> Callable[[str], object]:
    """A module ``__getattr__`` that refuses TorchRec's names of ``module`` by name."""
    refused = _WHY.get(module, {})

    def __getattr__(name: str) -> object:
        if name in refused:
            where = module.replace("rectrain", "torchrec", 1)
            raise PlannerApiRefused(f"{where}.{name} {refused[name]}; rectrain does not have it: {_PLAN}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
