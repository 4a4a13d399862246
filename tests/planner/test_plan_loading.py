"""The planner's context hash and a stored plan (TorchRec's ``hash_planner_context_inputs`` and
``plan_loader``): a plan is reused only where the inputs hash the same."""

from dataclasses import replace

import pytest

from rectrain.distributed.planner.perf_models import NoopPerfModel
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.errors import ConfigError
from rectrain.planner import EmbeddingShardingPlanner, PlannerError, Topology
from rectrain.planner.enumerate import EmbeddingEnumerator
from rectrain.planner.errors import PlannerErrorType
from rectrain.planner.plan_checks import PlanLoader

TABLES = {"ebc": [EmbeddingBagConfig(1000, 32, name=f"t{i}") for i in range(2)]}


class StoredPlan(PlanLoader):
    def __init__(self, options, context_hash):
        self._options, self._hash = options, context_hash

    def load(self):
        return self._options

    def plan_context_hash(self):
        return self._hash


def _planner(world=2, batch=128, **kwargs):
    return EmbeddingShardingPlanner(Topology(world_size=world), batch_size=batch, **kwargs)


def test_context_hash_is_equal_for_equal_inputs_and_differs_otherwise():
    a, b, c = _planner(), _planner(), _planner(world=4, batch=256)
    for p in (a, b, c):
        p.plan(TABLES)
    assert a.hash_planner_context_inputs() == b.hash_planner_context_inputs()
    assert a.hash_planner_context_inputs_str() == b.hash_planner_context_inputs_str()
    assert a.hash_planner_context_inputs() != c.hash_planner_context_inputs()


def test_own_enumerator_and_noop_perf_model_are_taken_others_refused():
    topo = Topology(world_size=2)
    enumerator = EmbeddingEnumerator(topo, 128)
    planner = EmbeddingShardingPlanner(
        topo, 128, enumerator=enumerator, performance_model=NoopPerfModel(topo)
    )
    planner.plan(TABLES)
    assert enumerator.last_stored_search_space  # the user's enumerator did the enumeration
    with pytest.raises(ConfigError, match=r"EmbeddingShardingPlanner\(enumerator, performance_model=...\)"):
        EmbeddingShardingPlanner(topo, 128, enumerator=object(), performance_model=object())


def test_matching_stored_plan_is_the_plan_and_a_mismatch_is_refused():
    baseline = _planner()
    plan = baseline.plan(TABLES)
    flipped = {}
    for option in baseline._best_plan:
        shards = [replace(s, rank=None if s.rank is None else 1 - s.rank) for s in option.shards]
        flipped[option.storage_hash()] = option.with_shards(shards)
    context = baseline.hash_planner_context_inputs_str()

    loaded = _planner(plan_loader=StoredPlan(flipped, context)).plan(TABLES)
    for name, sharding in plan.plan["ebc"].items():
        if sharding.sharding_type != "data_parallel":
            assert loaded.plan["ebc"][name].ranks == [1 - r for r in sharding.ranks]

    # A loader with no stored options: the planner searches as without one.
    assert _planner(plan_loader=StoredPlan(None, context)).plan(TABLES).to_json() == plan.to_json()

    with pytest.raises(PlannerError, match="planner input mismatch") as e:
        _planner(plan_loader=StoredPlan(flipped, "another")).plan(TABLES)
    assert e.value.error_type == PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH


def test_world_smaller_than_one_host_runs_on_that_host():
    assert Topology(world_size=1, local_world_size=8).local_world_size == 1
