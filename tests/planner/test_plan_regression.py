"""The planner's plans, reports and memory estimates for recorded cases stay as they were recorded.

``data/recorded_plans.json`` holds, per case, the plan's JSON (layout, per-shard bytes and seconds), its
report and the memory check's per-rank estimate, captured from the planner before its types were unified
with TorchRec's (seconds re-recorded when the bandwidth defaults became TorchRec's GiB figures: every layout
and byte figure stayed). Re-record (only for an intended change of the planner's model) with
``RECTRAIN_RECORD_PLANS=1 python -m pytest tests/planner/test_plan_regression.py``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from rectrain.embedding.config import DataType, EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig
from rectrain.errors import RecTrainError
from rectrain.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from rectrain.planner.memory import check_fits, rank_memory

DATA = Path(__file__).parent / "data" / "recorded_plans.json"
MB = 1024**2


def _dlrm() -> dict:
    """Criteo-like DLRM: 26 tables of mixed sizes, 64 wide."""
    rows = [10_000_000, 40_000, 3_000_000, 20_000, 500, 60, 12_000, 600, 3, 90_000, 5_000, 8_000_000, 3_000]
    rows += [27, 14_000, 5_000_000, 10, 5_500, 2_000, 4, 7_000_000, 18, 15, 280_000, 100, 140_000]
    return {"model.sparse_arch.embedding_bag_collection": [
        EmbeddingBagConfig(n, 64, name=f"t_cat_{i}", feature_names=[f"cat_{i}"]) for i, n in enumerate(rows)
    ]}  # fmt: skip


def _mixed() -> dict:
    return {
        "ebc": [
            EmbeddingBagConfig(2_000_000, 128, name="big"),
            EmbeddingBagConfig(100_000, 64, name="mid", feature_names=["a", "b"]),
            EmbeddingBagConfig(1_000, 16, name="small"),
            EmbeddingBagConfig(50_000, 256, name="wide", data_type=DataType.FP16),
        ],
        "ec": [EmbeddingConfig(300_000, 32, name="seq"), EmbeddingConfig(5_000, 96, name="seq_small")],
    }


def _constrained() -> dict:
    return {"ebc": [EmbeddingBagConfig(200_000, 64 * (i % 3 + 1), name=f"c{i}") for i in range(6)]}


_FORCE = {
    "c0": ParameterConstraints(sharding_types=["data_parallel"]),
    "c1": ParameterConstraints(sharding_types=["table_wise"], pooling_factors=[20.0]),
    "c2": ParameterConstraints(sharding_types=["row_wise"], batch_sizes=[128]),
    "c3": ParameterConstraints(sharding_types=["column_wise"]),
    "c4": ParameterConstraints(sharding_types=["table_row_wise"]),
    "c5": ParameterConstraints(sharding_types=["column_wise"], column_wise_shard_dim=48),
}
_CW = {
    "c0": ParameterConstraints(sharding_types=["column_wise"]),
    "c1": ParameterConstraints(sharding_types=["column_wise"], min_partition=64),
    "c2": ParameterConstraints(sharding_types=["column_wise"], column_wise_shard_dim=32),
    "c4": ParameterConstraints(sharding_types=["column_wise"]),
    "c5": ParameterConstraints(sharding_types=["column_wise"], column_wise_shard_dim=128),
}

# name -> (tables, topology kwargs, planner kwargs)
CASES = {
    "dlrm_1": (_dlrm, {"world_size": 1, "ddr_cap": 64 * 1024 * MB}, {}),
    "dlrm_2": (_dlrm, {"world_size": 2, "ddr_cap": 8 * 1024 * MB}, {"batch_size": 1024}),
    "dlrm_4": (_dlrm, {"world_size": 4, "local_world_size": 2, "ddr_cap": 4 * 1024 * MB}, {}),
    "dlrm_4_tight": (_dlrm, {"world_size": 4, "ddr_cap": 2600 * MB}, {"batch_size": 256}),
    "dlrm_8_cuda": (
        _dlrm,
        {"world_size": 8, "local_world_size": 4, "compute_device": "cuda", "hbm_cap": 5 * 1024 * MB},
        {"fused_optimizer": FusedOptimizerConfig(optimizer="adam")},
    ),
    "mixed_2": (_mixed, {"world_size": 2, "ddr_cap": 4 * 1024 * MB}, {}),
    "mixed_4_tight": (_mixed, {"world_size": 4, "local_world_size": 2, "ddr_cap": 600 * MB}, {}),
    "forced_4": (
        _constrained,
        {"world_size": 4, "local_world_size": 2, "ddr_cap": 4 * 1024 * MB},
        {"constraints": _FORCE},
    ),
    "column_wise_4": (_constrained, {"world_size": 4, "ddr_cap": 4 * 1024 * MB}, {"constraints": _CW}),
    "column_wise_8": (
        _constrained,
        {"world_size": 8, "local_world_size": 4, "ddr_cap": 4 * 1024 * MB},
        {"constraints": _CW},
    ),
}


# Refusals: name -> (tables, topology kwargs, planner kwargs, per-rank capacity the memory check is given);
# the recorded value is the error's type and text.
REFUSALS = {
    "refused_too_big_2": (_dlrm, {"world_size": 2, "ddr_cap": 300 * MB}, {}, None),
    "refused_forced_dp_4": (
        _constrained,
        {"world_size": 4, "ddr_cap": 150 * MB},
        {"constraints": {f"c{i}": ParameterConstraints(sharding_types=["data_parallel"]) for i in range(6)}},
        None,
    ),
    "memory_check_refused_2": (_dlrm, {"world_size": 2, "ddr_cap": 8 * 1024 * MB}, {}, 1024 * MB),
}


def _record(name: str) -> dict:
    if name in REFUSALS:
        make_tables, topology, kwargs, capacity = REFUSALS[name]
    else:
        (make_tables, topology, kwargs), capacity = CASES[name], None
    tables = make_tables()
    planner = EmbeddingShardingPlanner(Topology(**topology), **kwargs)
    try:
        plan = planner.plan(tables)
        memory = rank_memory(plan, tables, kwargs.get("fused_optimizer"), kwargs.get("batch_size", 512))
        if capacity is not None:
            check_fits(memory, [capacity] * plan.world_size, "recorded case")
    except RecTrainError as e:
        assert name in REFUSALS, f"{name}: {type(e).__name__}: {e}"
        return {"refused": f"{type(e).__name__}: {e}"}
    assert name not in REFUSALS, f"{name} was not refused"
    return {"plan": plan.to_dict(), "report": plan.report(), "memory": [m.total for m in memory]}


def _close(actual, expected, where: str) -> None:
    """Equal, with floats (seconds) equal to 12 significant digits."""
    if isinstance(expected, float):
        assert math.isclose(actual, expected, rel_tol=1e-12), f"{where}: {actual} != {expected}"
    elif isinstance(expected, dict):
        assert sorted(actual) == sorted(expected), f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            _close(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _close(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@pytest.mark.parametrize("name", sorted(CASES) + sorted(REFUSALS))
def test_recorded_plan_is_unchanged(name):
    actual = json.loads(json.dumps(_record(name)))
    if os.environ.get("RECTRAIN_RECORD_PLANS"):
        recorded = json.loads(DATA.read_text()) if DATA.exists() else {}
        recorded[name] = actual
        DATA.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    expected = json.loads(DATA.read_text())[name]
    _close(actual, expected, name)
