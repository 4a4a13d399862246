"""The row cache of disk tables on its own (``rectrain.embedding.disk_cache``), over real mapped files: hot
rows stay resident under churn (LFU with ageing), rows move in batches over the I/O threads and land in
the right slots, and a prefetched batch is not looked up a second time by its step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rectrain.embedding import disk_cache, disk_tables
from rectrain.embedding.disk_cache import CachedTable, RowCache
from rectrain.embedding.disk_tables import DiskBuffers, DiskTablesSettings

ROWS, WIDTH = 4096, 8


@pytest.fixture
def files(tmp_path: Path) -> Iterator[DiskBuffers]:
    before = disk_tables.settings()
    disk_tables.configure(DiskTablesSettings(dir=str(tmp_path)))
    buffers = DiskBuffers("t", {"weights": (ROWS * WIDTH, torch.float32), "momentum1": (ROWS, torch.float32)})
    # Each row holds its own number: a slot's contents name the row it was read from.
    buffers["weights"].copy_(torch.arange(ROWS, dtype=torch.float32).repeat_interleave(WIDTH))
    buffers["momentum1"].copy_(-torch.arange(ROWS, dtype=torch.float32))
    yield buffers
    disk_tables.configure(before)


def _cache(files: DiskBuffers, slots: int) -> RowCache:
    cache = {"weights": torch.zeros(slots, WIDTH), "momentum1": torch.zeros(slots, 1)}
    backing = {"weights": files["weights"].view(ROWS, WIDTH), "momentum1": files["momentum1"].view(ROWS, 1)}
    return RowCache([CachedTable("t", cache, backing)], [1])


def _offsets(ids: torch.Tensor) -> torch.Tensor:
    return torch.tensor([0, ids.numel()])


def _check_slots(cache: RowCache, ids: torch.Tensor, slots: torch.Tensor) -> None:
    table = cache.tables[0]
    assert torch.equal(table.cache["weights"][slots, 0], ids.float()), "each id's slot holds its row"
    assert torch.equal(table.cache["momentum1"][slots, 0], -ids.float()), "and the row's state"


def test_hot_rows_stay_resident_while_the_tail_churns(files: DiskBuffers) -> None:
    cache = _cache(files, slots=200)
    hot = torch.arange(20)
    generator = torch.Generator().manual_seed(0)
    for step in range(40):
        cold = 100 + torch.randperm(ROWS - 100, generator=generator)[:150]
        # The hot rows come every other batch, many times each; a recency order would evict them in the
        # batches they skip (150 new rows a batch against 200 slots).
        ids = torch.cat([hot.repeat(5), cold]) if step % 2 == 0 else cold
        slots = cache.remap(ids, _offsets(ids), train=True)
        _check_slots(cache, ids, slots)
        if step >= 2:
            assert bool((cache.tables[0].slot_of_row[hot] >= 0).all()), f"step {step}: a hot row was evicted"


def test_a_cache_that_chose_victims_by_score_never_fills_in_order_again(files: DiskBuffers) -> None:
    # 8 rows fill slots 0-7; 5 more take the two never-used slots and three victims by score; the third
    # batch's one miss must not take slot 8 or 9 in order: they hold the second batch's rows, hits now.
    cache = _cache(files, slots=10)
    for ids in (
        torch.arange(8),
        torch.arange(100, 105),
        torch.cat([torch.arange(100, 105), torch.tensor([200])]),
    ):
        _check_slots(cache, ids, cache.remap(ids, _offsets(ids), train=True))
    cache.flush()
    assert torch.equal(files["momentum1"], -torch.arange(ROWS, dtype=torch.float32)), "rows went back whole"


def test_a_large_cache_fills_its_empty_slots_then_evicts_from_a_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over MIN_WINDOW x WINDOW slots a batch's victims come from a window at the clock hand, not from every
    # slot; a low RESCALE makes the scores' rescaling happen during the run too.
    monkeypatch.setattr(disk_cache, "RESCALE", 2.0)
    rows, slots = 40_000, 3 * disk_cache.MIN_WINDOW + 100
    before = disk_tables.settings()
    disk_tables.configure(DiskTablesSettings(dir=str(tmp_path)))
    try:
        files = DiskBuffers("t", {"weights": (rows, torch.float32), "momentum1": (rows, torch.float32)})
    finally:
        disk_tables.configure(before)
    files["weights"].copy_(torch.arange(rows, dtype=torch.float32))
    files["momentum1"].copy_(-torch.arange(rows, dtype=torch.float32))
    table = CachedTable(
        "t",
        {"weights": torch.zeros(slots, 1), "momentum1": torch.zeros(slots, 1)},
        {"weights": files["weights"].view(rows, 1), "momentum1": files["momentum1"].view(rows, 1)},
    )
    cache = RowCache([table], [1])
    hot = torch.arange(100)
    generator = torch.Generator().manual_seed(3)
    for step in range(32):
        cold = 100 + torch.randperm(rows - 100, generator=generator)[:1000]
        ids = torch.cat([hot.repeat(3), cold, cold[:50]]) if step % 2 == 0 else cold
        batch = cache.remap(ids, _offsets(ids), train=True)
        _check_slots(cache, ids, batch)
        if step < 12:  # the cache is not yet full: rows take never-used slots, nothing is evicted
            assert cache.writes == 0 and table.filled == cache.misses
        elif step >= 14:
            assert bool((table.slot_of_row[hot] >= 0).all()), f"step {step}: a hot row was evicted"
    # Filling stops short of a batch's misses; the last never-used slots (score 0) are then the window's.
    assert slots - 1100 < table.filled <= slots
    assert table.hand != 0, "the later batches' victims came from the window"
    assert cache.writes > 0
    cache.flush()
    assert torch.equal(files["weights"], torch.arange(rows, dtype=torch.float32)), "rows went back whole"


def test_moves_fan_out_over_the_io_threads_and_write_back_whole_rows(
    files: DiskBuffers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_cache, "IO_CHUNK", 16)  # several pieces per move
    cache = _cache(files, slots=1000)
    first = torch.randperm(ROWS, generator=torch.Generator().manual_seed(1))[:900]
    slots = cache.remap(first, _offsets(first), train=True)
    _check_slots(cache, first, slots)
    table = cache.tables[0]
    table.cache["weights"][slots] += 0.5  # what a step's update does to its rows
    table.cache["momentum1"][slots] += 0.25
    second = torch.randperm(ROWS, generator=torch.Generator().manual_seed(2))[:900]
    slots = cache.remap(second, _offsets(second), train=False)
    assert torch.equal(table.cache["weights"][slots, 0] % 1, torch.where(torch.isin(second, first), 0.5, 0.0))
    cache.flush()
    updated = first.sort().values
    expected = torch.arange(ROWS, dtype=torch.float32)
    expected[updated] += 0.5
    assert torch.equal(files["weights"].view(ROWS, WIDTH)[:, 0], expected), "every updated row went back"
    assert torch.equal(files["momentum1"][updated], -updated.float() + 0.25)
    assert cache.writes == 900


def test_a_prefetched_batch_is_assigned_once(files: DiskBuffers) -> None:
    cache = _cache(files, slots=1000)
    ids = torch.tensor([5, 7, 5, 3000, 7, 9])
    cache.prefetch(ids, _offsets(ids))
    cache.wait()
    assert cache.misses == 4 and cache.lookups == 0, "the prefetch read the rows; the step has not run"
    slots = cache.remap(ids.clone(), _offsets(ids), train=True)
    _check_slots(cache, ids, slots)
    assert (cache.lookups, cache.misses, cache.id_lookups, cache.id_misses) == (4, 4, 6, 0)
    assert int(cache.tables[0].dirty.sum()) == 4
    # A step given another batch than the prefetched one assigns its own.
    cache.prefetch(ids, _offsets(ids))
    other = torch.tensor([11, 5, 12])
    slots = cache.remap(other, _offsets(other), train=False)
    _check_slots(cache, other, slots)
    assert cache.id_misses == 2
