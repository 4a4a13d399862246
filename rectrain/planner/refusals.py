"""TorchRec planner names rectrain does not have, each refused by name with what to use instead.

rectrain's planner searches proposals and placements inside ``EmbeddingShardingPlanner.plan`` and reports
the plan with ``ShardingPlan.report()``; TorchRec's proposers, partitioners and stats are
``rectrain.planner.proposers``, ``.partitioners`` and ``.stats``. A module at a TorchRec path sets
``__getattr__ = refusing_getattr(__name__)``; a refused class TorchRec code imports beside names rectrain has
is ``refused_class(__name__, name)``, refused when constructed.
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
        "EmbeddingPlannerBase": _COMPONENT,
        "to_sharding_plan": "turns placed options into a plan; the planner returns a ShardingPlan",
    },
    _P + "proposers": {
        "EmbeddingOffloadScaleupProposer": "is the UVM-cache scale-up proposer; rectrain runs no UVM cache"
    },
    _P + "estimator": {"EmbeddingPerfEstimatorFactory": "builds TorchRec's perf estimators; " + _COMPONENT},
    _P + "types": _each(
        "PlanDebugStats CriticalPathEstimate",
        "describes TorchRec's plan debugging stats; rectrain's plan report is ShardingPlan.report()",
    ),
}


class PlannerApiRefused(RecTrainError, NotImplementedError):
    """A TorchRec planner name rectrain does not have."""


def refused_class(module: str, name: str) -> type:
    """A class at ``module.name`` that imports (TorchRec code imports it beside names rectrain has) and
    refuses by name when constructed."""
    why = _WHY[module][name]

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        where = module.replace("rectrain", "torchrec", 1)
        raise PlannerApiRefused(f"{where}.{name} {why}; rectrain does not have it: {_PLAN}")

    return type(name, (), {"__init__": __init__, "__module__": module, "__doc__": f"Refused: {why}."})


def refusing_getattr(module: str) -> Callable[[str], object]:
    """A module ``__getattr__`` that refuses TorchRec's names of ``module`` by name."""
    refused = _WHY.get(module, {})

    def __getattr__(name: str) -> object:
        if name in refused:
            where = module.replace("rectrain", "torchrec", 1)
            raise PlannerApiRefused(f"{where}.{name} {refused[name]}; rectrain does not have it: {_PLAN}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
