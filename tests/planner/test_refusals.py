"""TorchRec planner names rectrain does not have are refused by name, with what to use instead."""

import importlib

import pytest

from rectrain.planner.refusals import _WHY, PlannerApiRefused

CASES = [(module, name) for module, names in sorted(_WHY.items()) for name in sorted(names)]


@pytest.mark.parametrize(("module", "name"), CASES)
def test_refused_by_name(module, name):
    with pytest.raises(
        PlannerApiRefused, match=rf"^torchrec\.distributed\.planner\.\w+\.{name} .*EmbeddingShardingPlanner"
    ):
        value = getattr(importlib.import_module(module), name)
        value()  # a refused class imports (beside names rectrain has) and refuses when built


def test_from_import_is_refused_and_unknown_names_are_missing():
    with pytest.raises(NotImplementedError, match="EmbeddingPlannerBase"):
        from rectrain.distributed.planner.planners import EmbeddingPlannerBase  # noqa: F401
    planners = importlib.import_module("rectrain.distributed.planner.planners")
    assert not hasattr(planners, "no_such_name")
    assert planners.EmbeddingShardingPlanner.__module__ == "rectrain.planner.planner"
