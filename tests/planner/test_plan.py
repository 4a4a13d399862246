import copy
import json

import pytest

from rectrain.errors import ConfigError
from rectrain.planner import (
    EmbeddingShardingPlanner,
    ParameterSharding,
    Shard,
    ShardingPlan,
    ShardingType,
    Topology,
)
from rectrain.planner.plan import FORMAT_VERSION
from tests.planner.helpers import standard_tables

MB = 1_000_000


@pytest.fixture(scope="module")
def plan() -> ShardingPlan:
    topo = Topology(world_size=2, ddr_cap=4000 * MB)
    return EmbeddingShardingPlanner(topo).plan(standard_tables(4, rows=1000, dim=16))


def test_json_round_trip(plan, tmp_path):
    text = plan.to_json()
    data = json.loads(text)
    assert data["format_version"] == FORMAT_VERSION
    entry = data["modules"]["ebc"]["t0"]
    assert {"sharding_type", "compute_kernel", "ranks", "shards", "num_embeddings", "embedding_dim"} <= set(
        entry
    )
    assert {"row_offset", "num_rows", "col_offset", "num_cols", "rank"} <= set(entry["shards"][0])
    again = ShardingPlan.from_json(text)
    assert again.to_json() == text
    assert again.plan == plan.plan
    plan.save(tmp_path / "plan.json")
    assert ShardingPlan.load(tmp_path / "plan.json").to_json() == text
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temp file left behind


def test_hand_written_plan_without_estimates_loads(plan):
    data = json.loads(plan.to_json())
    for shard in data["modules"]["ebc"]["t0"]["shards"]:
        del shard["storage"], shard["perf"]
    loaded = ShardingPlan.from_dict(data)
    assert loaded.plan["ebc"]["t0"].sharding_spec[0].storage is None
    assert "?" in loaded.report()


def _edited(plan: ShardingPlan, edit) -> dict:
    data = copy.deepcopy(json.loads(plan.to_json()))
    edit(data, data["modules"]["ebc"]["t0"])
    return data


def _set_rank(data, entry):
    entry["shards"][0]["rank"] = 5
    entry["ranks"] = [5]


def _shrink(data, entry):
    entry["shards"][0]["num_rows"] = 999


def _overlap(data, entry):
    entry["sharding_type"] = "row_wise"
    shard = entry["shards"][0]
    entry["shards"] = [dict(shard, rank=0, num_rows=600), dict(shard, rank=1, row_offset=500, num_rows=500)]
    entry["ranks"] = [0, 1]


@pytest.mark.parametrize(
    "edit, message",
    [
        (_set_rank, r"plan ebc.t0: shards\[0\].rank is 5 but world_size is 2"),
        (_shrink, "plan ebc.t0: shards cover 15984 of the table's 1000 x 16 = 16000 cells"),
        (_overlap, r"plan ebc.t0: shards\[0\] and shards\[1\] overlap"),
        (lambda d, e: e.update(sharding_type="diagonal"), "plan ebc.t0: sharding_type must be one of"),
        (lambda d, e: e.pop("num_embeddings"), "plan ebc.t0: missing field 'num_embeddings'"),
        (
            lambda d, e: e["shards"][0].update(colour=1),
            r"plan ebc.t0: shards\[0\] has unknown fields \['colour'\]",
        ),
        (
            lambda d, e: e.update(ranks=[1 - e["ranks"][0]]),
            "plan ebc.t0: ranks .* do not match the shards' ranks",
        ),
        (lambda d, e: d.update(format_version=99), "plan format_version 99 is not supported"),
        (lambda d, e: d.pop("world_size"), "plan is missing the field 'world_size'"),
    ],
)
def test_hand_edit_errors_name_the_field(plan, edit, message):
    with pytest.raises(ConfigError, match=message):
        ShardingPlan.from_dict(_edited(plan, edit))


def test_bad_json_is_a_config_error():
    with pytest.raises(ConfigError, match="plan is not valid JSON"):
        ShardingPlan.from_json("{not json")


def test_override_one_table_keeps_the_rest(plan):
    edited = ShardingPlan.from_json(plan.to_json())
    row_wise = ParameterSharding(
        "row_wise", "fused", sharding_spec=[Shard(0, 500, 0, 16, rank=0), Shard(500, 500, 0, 16, rank=1)]
    )
    edited.override("ebc", "t0", row_wise)
    assert edited.plan["ebc"]["t0"].sharding_type == ShardingType.ROW_WISE
    assert edited.plan["ebc"]["t0"].ranks == [0, 1]
    assert edited.plan["ebc"]["t1"] == plan.plan["ebc"]["t1"]
    assert ShardingPlan.from_json(edited.to_json()).to_json() == edited.to_json()


def test_override_is_validated(plan):
    edited = ShardingPlan.from_json(plan.to_json())
    lopsided = ParameterSharding(
        "row_wise", "fused", sharding_spec=[Shard(0, 900, 0, 16, rank=0), Shard(900, 100, 0, 16, rank=1)]
    )
    with pytest.raises(ConfigError, match=r"row_wise shards must be the 2 row blocks of ceil\(1000 / 2\)"):
        edited.override("ebc", "t0", lopsided)
    with pytest.raises(ConfigError, match=r"plan has no table ebc.nope"):
        edited.override("ebc", "nope", lopsided)
    assert edited.to_json() == plan.to_json()


def test_report_lists_every_rank_and_the_imbalance(plan):
    report = plan.report()
    assert str(plan) == report
    lines = report.splitlines()
    assert lines[1].split()[:3] == ["rank", "memory_bytes", "est_seconds"]
    rank_rows = [line for line in lines[2:] if line[:4].strip().isdigit()]
    assert [int(line.split()[0]) for line in rank_rows] == [0, 1]
    for t in range(4):
        assert f"ebc.t{t} TW/fused rows 0:1000 cols 0:16" in report
    assert "imbalance (max/mean): perf 1.000, memory 1.000" in report


def test_override_with_data_parallel_fills_every_rank(plan):
    edited = ShardingPlan.from_json(plan.to_json())
    edited.override(
        "ebc", "t1", ParameterSharding("data_parallel", "dense", sharding_spec=[Shard(0, 1000, 0, 16)])
    )
    assert edited.plan["ebc"]["t1"].ranks == [0, 1]
    assert "ebc.t1 DP/dense rows 0:1000 cols 0:16 ?" in edited.report()
