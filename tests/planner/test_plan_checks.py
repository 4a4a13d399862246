"""Plan checks (TorchRec's validate_* and extract_plan) and the planner's TorchRec contract for modules."""

import pytest
import torch
from torch import nn

from rectrain.distributed.parallel.sharders import EmbeddingBagCollectionSharder
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    ShardingPlan,
    Topology,
)
from rectrain.planner.errors import PlannerErrorType
from rectrain.planner.plan_checks import (
    extract_plan,
    validate_compute_kernels,
    validate_modules_inclusion_in_sharding_plan,
)

MB = 1024**2


class _Model(nn.Module):
    def __init__(self, rows: int = 100) -> None:
        super().__init__()
        tables = [EmbeddingBagConfig(rows, 16, name=f"t{i}", feature_names=[f"f{i}"]) for i in range(2)]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.dense = nn.Linear(4, 4)


class _OnlyT0(EmbeddingBagCollectionSharder):
    def shardable_parameters(self, module):
        return {k: v for k, v in super().shardable_parameters(module).items() if k == "t0"}


def test_planner_plans_what_the_sharders_shard():
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=100 * MB))
    assert set(planner.plan(_Model(), [_OnlyT0()]).plan["ebc"]) == {"t0"}
    assert planner.plan(_Model(), []) == ShardingPlan({})
    plan = planner.plan(_Model(), [EmbeddingBagCollectionSharder()])
    validate_modules_inclusion_in_sharding_plan(plan, _Model(), [EmbeddingBagCollectionSharder()])
    validate_compute_kernels(planner._best_plan)
    with pytest.raises(PlannerError, match=r"\['ebc'\]") as missing:
        validate_modules_inclusion_in_sharding_plan(
            ShardingPlan({}), _Model(), [EmbeddingBagCollectionSharder()]
        )
    assert missing.value.error_type == PlannerErrorType.MISSING_MODULE_IN_PLAN


def test_constraints_kernel_options_reach_the_plan_and_kernel_checks_name_the_table():
    constraints = {"t0": ParameterConstraints(stochastic_rounding=False, enforce_hbm=True)}
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=100 * MB), constraints=constraints)
    sharding = planner.plan(_Model(), [EmbeddingBagCollectionSharder()]).plan["ebc"]["t0"]
    assert (sharding.stochastic_rounding, sharding.enforce_hbm) == (False, True)
    bad = planner._best_plan[0]
    bad.compute_kernel = "no_such_kernel"
    with pytest.raises(PlannerError, match="ebc.t0: unknown compute kernel") as failure:
        validate_compute_kernels([bad])
    assert failure.value.error_type == PlannerErrorType.INVALID_COMPUTE_KERNEL


def test_extract_plan_takes_the_loaded_shards_of_matching_options():
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=100 * MB))
    planner.plan(_Model(), [EmbeddingBagCollectionSharder()])
    loaded = {o.storage_hash(): o for o in planner._best_plan}
    merged = extract_plan(planner._enumerator.last_stored_search_space, loaded)
    assert [(o.name, o.shards) for o in merged] == [(o.name, o.shards) for o in planner._best_plan]
    with pytest.raises(PlannerError, match="duplicate storage hash"):
        extract_plan([merged[0], merged[0]], loaded)


def test_no_fit_is_insufficient_storage_or_strict_constraints():
    topology = Topology(world_size=2, ddr_cap=1 * MB)
    with pytest.raises(PlannerError) as failure:
        EmbeddingShardingPlanner(topology).plan(_Model(rows=100_000), [EmbeddingBagCollectionSharder()])
    assert failure.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    tw_only = {"t0": ParameterConstraints(sharding_types=["table_wise"])}
    with pytest.raises(PlannerError) as failure:
        EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=6 * MB), constraints=tw_only).plan(
            {"ebc": [EmbeddingBagConfig(100_000, 16, name="t0")]}
        )
    assert failure.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS
