import random

import pytest

from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig
from rectrain.errors import ConfigError
from rectrain.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    ShardingType,
    Topology,
)
from tests.planner.helpers import rank_perf, rank_storage, standard_tables

MB = 1_000_000


def _mixed_tables(seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    sparse = [
        EmbeddingBagConfig(rng.randint(1_000, 400_000), rng.choice([16, 32, 64, 128]), name=f"bag{i}")
        for i in range(6)
    ]
    seq = [EmbeddingConfig(rng.randint(1_000, 100_000), 64, name=f"seq{i}") for i in range(2)]
    return {"model.sparse.ebc": sparse, "model.sparse.ec": seq}


@pytest.mark.parametrize("world, local, cap_mb", [(1, 1, 2000), (2, 2, 300), (4, 2, 150), (8, 4, 60)])
@pytest.mark.parametrize("seed", [0, 1])
def test_memory_caps_respected_on_every_rank(world, local, cap_mb, seed):
    topo = Topology(world_size=world, local_world_size=local, ddr_cap=cap_mb * MB)
    plan = EmbeddingShardingPlanner(topo, batch_size=256).plan(_mixed_tables(seed))
    used = rank_storage(plan)
    assert len(used) == world
    assert all(0 <= u <= cap_mb * MB for u in used), used


@pytest.mark.parametrize("world", [1, 2])
def test_standard_workload_is_balanced(world):
    plan = EmbeddingShardingPlanner(Topology(world_size=world, ddr_cap=4000 * MB), batch_size=512).plan(
        standard_tables()
    )
    perf, storage = rank_perf(plan), rank_storage(plan)
    assert max(perf) / (sum(perf) / world) < 1.05
    assert max(storage) / (sum(storage) / world) < 1.05
    assert {s.sharding_type for s in plan.plan["ebc"].values()} == {ShardingType.TABLE_WISE}


def test_large_table_is_split_when_one_rank_cannot_hold_it():
    big = EmbeddingBagConfig(2_000_000, 64, name="big")  # 512 MB of weights
    topo = Topology(world_size=4, local_world_size=2, ddr_cap=300 * MB)
    plan = EmbeddingShardingPlanner(topo).plan({"ebc": [big, EmbeddingBagConfig(1000, 16, name="small")]})
    sharding = plan.plan["ebc"]["big"]
    assert sharding.sharding_type in (
        ShardingType.ROW_WISE,
        ShardingType.COLUMN_WISE,
        ShardingType.TABLE_ROW_WISE,
    )
    assert len(set(sharding.ranks)) > 1
    assert max(rank_storage(plan)) <= 300 * MB


def test_infeasible_plan_names_table_size_and_shortfall():
    topo = Topology(world_size=2, ddr_cap=50 * MB)
    tables = {"ebc": [EmbeddingBagConfig(1_000_000, 64, name="huge"), EmbeddingBagConfig(10, 8, name="tiny")]}
    with pytest.raises(PlannerError) as info:
        EmbeddingShardingPlanner(topo, batch_size=128).plan(tables)
    message = str(info.value)
    assert "'huge'" in message
    assert "1000000 x 64" in message and "256,000,000 bytes of weights" in message
    assert "rank 0: 50,000,000 free, short" in message and "rank 1: 50,000,000 free, short" in message


def test_infeasible_after_placement_names_the_table_that_did_not_fit():
    # Each table fits a rank alone, but three of them cannot share two ranks.
    tables = {"ebc": [EmbeddingBagConfig(100_000, 64, name=f"t{i}") for i in range(3)]}
    constraints = {f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(3)}
    topo = Topology(world_size=2, ddr_cap=30 * MB)
    with pytest.raises(PlannerError, match=r"cannot place table 't\d'.*short [1-9]"):
        EmbeddingShardingPlanner(topo, constraints=constraints).plan(tables)


def test_plan_is_deterministic_and_independent_of_input_order():
    tables = _mixed_tables(3)
    topo = Topology(world_size=4, local_world_size=2, ddr_cap=200 * MB)
    first = EmbeddingShardingPlanner(topo).plan(tables).to_json()
    assert EmbeddingShardingPlanner(topo).plan(tables).to_json() == first
    shuffled = {path: list(reversed(configs)) for path, configs in reversed(list(tables.items()))}
    assert EmbeddingShardingPlanner(topo).plan(shuffled).to_json() == first


def test_constraints_are_honoured():
    constraints = {
        "t0": ParameterConstraints(sharding_types=["row_wise"]),
        "t1": ParameterConstraints(sharding_types=["data_parallel"]),
    }
    plan = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=4000 * MB), constraints=constraints).plan(
        standard_tables(3)
    )
    assert plan.plan["ebc"]["t0"].sharding_type == ShardingType.ROW_WISE
    assert plan.plan["ebc"]["t0"].ranks == [0, 1]
    assert plan.plan["ebc"]["t1"].sharding_type == ShardingType.DATA_PARALLEL
    assert plan.plan["ebc"]["t1"].ranks == [0, 1]


def test_twrw_across_hosts_and_on_one_host():
    constraints = {"t0": ParameterConstraints(sharding_types=["table_row_wise"])}
    plan = EmbeddingShardingPlanner(
        Topology(world_size=4, local_world_size=2, ddr_cap=4000 * MB), constraints=constraints
    ).plan(standard_tables(1))
    sharding = plan.plan["ebc"]["t0"]
    assert sharding.sharding_type == ShardingType.TABLE_ROW_WISE
    assert sharding.ranks in ([0, 1], [2, 3])
    # One host: row-wise within it (TorchRec plans it the same way).
    plan = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=4000 * MB), constraints=constraints).plan(
        standard_tables(1)
    )
    assert plan.plan["ebc"]["t0"].sharding_type == ShardingType.TABLE_ROW_WISE
    assert plan.plan["ebc"]["t0"].ranks == [0, 1]


def test_bad_inputs_are_named():
    planner = EmbeddingShardingPlanner(Topology(world_size=1, ddr_cap=4000 * MB))
    with pytest.raises(ConfigError, match=r"constraints name tables that do not exist: \['nope'\]"):
        EmbeddingShardingPlanner(
            Topology(world_size=1, ddr_cap=MB), constraints={"nope": ParameterConstraints()}
        ).plan(standard_tables(1))
    dup = {"ebc": [EmbeddingBagConfig(10, 8, name="a"), EmbeddingBagConfig(10, 8, name="a")]}
    with pytest.raises(ConfigError, match=r"table names must be unique; repeated: \['a'\]"):
        planner.plan(dup)
    with pytest.raises(ConfigError, match="batch_size must be a positive int, got 0"):
        EmbeddingShardingPlanner(batch_size=0)
    with pytest.raises(ConfigError, match="takes a dict"):
        planner.plan([EmbeddingBagConfig(10, 8, name="a")])


def test_module_is_scanned_for_collections():
    from torch import nn

    class Collection(nn.Module):
        def __init__(self, configs):
            super().__init__()
            self._configs = configs

        def embedding_bag_configs(self):
            return self._configs

    model = nn.Module()
    model.sparse = Collection(standard_tables(2)["ebc"])
    plan = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=4000 * MB)).plan(model)
    assert sorted(plan.get_plan_for_module("sparse")) == ["t0", "t1"]


def test_default_topology_without_a_process_group_is_one_rank():
    planner = EmbeddingShardingPlanner()
    assert planner.topology.world_size == 1
    plan = planner.plan(standard_tables(2, rows=100, dim=8))
    assert all(s.ranks == [0] for s in plan.plan["ebc"].values())


class _CpuSharder:
    """A sharder as TorchRec's EmbeddingBagCollectionSharder presents itself to the planner on CPU."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return ["data_parallel", "table_wise", "column_wise", "table_column_wise"]


def test_sharders_restrict_the_sharding_types_like_torchrec():
    topology = Topology(world_size=2, ddr_cap=4000 * MB)
    plan = EmbeddingShardingPlanner(topology).plan(standard_tables(4), [_CpuSharder()])
    kinds = {s.sharding_type for s in plan.plan["ebc"].values()}
    assert kinds <= {ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE}
    constraints = {"t0": ParameterConstraints(sharding_types=["row_wise"])}
    with pytest.raises(ConfigError, match=r"allowed by the constraints \(\[row_wise\]\) and offered by"):
        EmbeddingShardingPlanner(topology, constraints=constraints).plan(standard_tables(1), [_CpuSharder()])
    with pytest.raises(ConfigError, match="sharders: a object has no sharding_types"):
        EmbeddingShardingPlanner(topology).plan(standard_tables(1), [object()])


def test_torchrec_storage_rule_plugs_in_beside_ours():
    # TorchRec's per-shard storage rule as the planner's storage estimator: the plan's shard bytes are
    # TorchRec's DDR figures, and the caps still hold.
    from rectrain.planner.shard_estimators import estimate_storage_torchrec

    topo = Topology(world_size=2, ddr_cap=300 * MB)
    tables = _mixed_tables(0)
    plan = EmbeddingShardingPlanner(topo, batch_size=256, storage_estimator=estimate_storage_torchrec).plan(
        tables
    )
    sharding = plan.plan["model.sparse.ebc"]["bag0"]
    table = tables["model.sparse.ebc"][0]
    weights = table.num_embeddings * table.embedding_dim * 4
    assert sum(s.storage for s in sharding.sharding_spec) >= weights  # weights, state and a batch's ids
    assert all(u <= 300 * MB for u in rank_storage(plan))
