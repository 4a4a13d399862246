"""The planner logs its plan through TorchRec's stats objects; EmbeddingStats frames ShardingPlan.report()."""

import math

from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from rectrain.planner.stats import (
    EmbeddingStats,
    NoopEmbeddingStats,
    _calc_max_chi_sq_divergence,
    _calc_max_kl_divergence,
    _chi_sq_divergence,
    _kl_divergence,
    _total_variation,
)

MB = 1024**2
TABLES = {"ebc": [EmbeddingBagConfig(1000, 16, name=f"t{i}") for i in range(3)]}


def test_embedding_stats_frames_the_plan_report_and_counts_fixed_kernels():
    constraints = {"t0": ParameterConstraints(compute_kernels=["fused"])}
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=100 * MB), constraints=constraints)
    plan = planner.plan(TABLES)
    (stats,) = planner._stats
    table = stats._stats_table
    assert table[0] == "#" * len(table[0]) and all(row.startswith("#") and row.endswith("#") for row in table)
    for line in plan.report().splitlines():
        assert any(line in row for row in table)
    assert any("Top DDR Memory Usage Estimation:" in row for row in table)
    assert any("Hardcoded: 1, Auto-selected: 2" in row for row in table)
    assert planner._num_proposals >= planner._num_plans >= 1
    assert [o.name for o in planner._best_plan] == ["t0", "t1", "t2"]


def test_stats_can_be_replaced_or_dropped():
    for stats, count in ((NoopEmbeddingStats(), 1), ([], 0)):
        planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=100 * MB), stats=stats)
        planner.plan(TABLES)
        assert len(planner._stats) == count
    assert isinstance(EmbeddingShardingPlanner(Topology(world_size=1))._stats[0], EmbeddingStats)


def test_imbalance_measures_are_zero_when_even_and_at_their_bound_when_all_on_one_rank():
    even, skewed = [0.25] * 4, [1.0, 0.0, 0.0, 0.0]
    assert _total_variation(even) == _chi_sq_divergence(even) == _kl_divergence(even) == 0.0
    assert math.isclose(_chi_sq_divergence(skewed), _calc_max_chi_sq_divergence(4))
    assert math.isclose(_kl_divergence(skewed), _calc_max_kl_divergence(4))
