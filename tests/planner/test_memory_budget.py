"""The memory plan: tables in RAM or on disk within a rank's budget, hottest first, refused with numbers."""

from __future__ import annotations

import numpy as np
import pytest

from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.planner.memory_budget import (
    MemoryPlanError,
    check_disk_space,
    host_memory_limit,
    plan_memory,
    rank_budget,
    table_bytes,
)

OPT = FusedOptimizerConfig(optimizer="rowwise_adagrad")


def _table(name: str, rows: int, storage: str = "ram") -> EmbeddingBagConfig:
    return EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=64, storage=storage)


def test_table_bytes_count_rows_and_optimizer_state() -> None:
    assert table_bytes(_table("t", 1000), OPT) == 1000 * (64 * 4 + 4)
    assert table_bytes(_table("t", 1000), FusedOptimizerConfig(optimizer="adam")) == 1000 * 64 * 4 * 3


def test_everything_in_ram_when_it_fits() -> None:
    tables = [_table("a", 1000), _table("b", 2000)]
    plan = plan_memory(tables, OPT, budget_bytes=10**7)
    assert [t.storage for t in plan.tables] == ["ram", "ram"]
    assert [t.storage for t in plan.apply(tables)] == ["ram", "ram"]


def test_smallest_first_without_counts_and_the_rest_on_disk_with_the_leftover_as_cache() -> None:
    tables = [_table("big", 100_000), _table("small", 1000), _table("mid", 10_000)]
    each = {t.name: table_bytes(t, OPT) for t in tables}
    budget = each["small"] + each["mid"] + each["big"] // 4
    plan = plan_memory(tables, OPT, budget_bytes=budget)
    assert {t.name: t.storage for t in plan.tables} == {"big": "disk", "small": "ram", "mid": "ram"}
    big = next(t for t in plan.tables if t.name == "big")
    assert big.cache_bytes == each["big"] // 4 and big.hit_rate is None
    text = plan.report()
    assert "big: disk" in text and "small: ram" in text and "cache 0.006 GB" in text


def test_hottest_first_with_counts_and_expected_hit_rate() -> None:
    tables = [_table("cold", 1000), _table("hot", 1000)]
    counts = {"cold": np.ones(1000), "hot": np.r_[np.full(100, 90.0), np.ones(900)]}
    one = table_bytes(tables[0], OPT)
    plan = plan_memory(tables, OPT, budget_bytes=one + one // 10, id_counts=counts)
    placed = {t.name: t for t in plan.tables}
    assert placed["hot"].storage == "ram" and placed["cold"].storage == "disk"
    assert placed["cold"].hit_rate == pytest.approx(0.1, abs=0.002)  # a tenth of uniform rows cached

    # The other way round: the cold table in RAM, and the hot one's cache of a tenth holds its hot rows.
    plan = plan_memory(
        [tables[0], _table("hot", 1000, storage="disk")], OPT, budget_bytes=one + one // 10, id_counts=counts
    )
    hot = next(t for t in plan.tables if t.name == "hot")
    assert hot.storage == "disk" and hot.hit_rate == pytest.approx(9000 / 9900, abs=0.01)


def test_world_size_shares_the_tables() -> None:
    tables = [_table("a", 100_000)]
    assert (
        plan_memory(tables, OPT, budget_bytes=table_bytes(tables[0], OPT) // 2 + 1, world_size=2)
        .tables[0]
        .storage
        == "ram"
    )


def test_refused_before_allocation_naming_the_numbers() -> None:
    tables = [_table("a", 100_000)]
    with pytest.raises(
        MemoryPlanError, match=r"a rank needs 1\.00 GB \(fixed 1\.00 GB.*budget is 0\.50 GB \(given\)"
    ):
        plan_memory(tables, OPT, budget_bytes=500_000_000, fixed_bytes=1_000_000_000)
    with pytest.raises(Exception, match="id_counts\\['a'\\]: expected one count per row"):
        plan_memory(tables, OPT, budget_bytes=10**9, id_counts={"a": [1, 2]})


def test_budget_from_the_host_and_disk_space(tmp_path) -> None:
    total, source = host_memory_limit()
    assert total > 0 and ("cgroup" in source or "MemAvailable" in source)
    per_rank, why = rank_budget(2, total_bytes=8 * 10**9)
    assert per_rank == 4 * 10**9 and why == "given / 2 ranks"
    plan = plan_memory([_table("a", 1000, storage="disk")], OPT, budget_bytes=10**8)
    check_disk_space(plan, tmp_path)
    huge = plan_memory([_table("a", 10**9, storage="disk")], OPT, budget_bytes=10**11)
    with pytest.raises(MemoryPlanError, match="disk tables need 260.00 GB in"):
        check_disk_space(huge, tmp_path)
