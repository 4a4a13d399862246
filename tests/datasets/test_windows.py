"""Global windows: every row in exactly one rank's block, resumable at any window end on any world size."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rectrain.datasets.windows import DataPosition, Holdout, rank_block, rank_windows, window_bounds
from rectrain.errors import ConfigError


def _epoch(rows: list[int], batch: int, world: int, start: int = 0, holdout: Holdout | None = None):
    """Per window: (every rank's block, window end), as the ranks of one step would read them."""
    kept = [(i, i) for i in rows if i >= start and (holdout is None or holdout.keeps(i))]
    per_rank = [list(rank_windows(kept, batch, r, world)) for r in range(world)]
    assert len({len(windows) for windows in per_rank}) == 1, "every rank sees the same number of windows"
    return [
        ([[i for i, _ in per_rank[r][k].rows] for r in range(world)], per_rank[0][k].end)
        for k in range(len(per_rank[0]))
    ]


@given(
    total=st.integers(0, 300),
    batch=st.integers(1, 20),
    world=st.integers(1, 5),
    every=st.sampled_from([None, 2, 3, 10]),
)
def test_every_row_is_in_exactly_one_block_and_no_block_is_empty(total, batch, world, every):
    holdout = Holdout(every, batch) if every else None
    windows = _epoch(list(range(total)), batch, world, holdout=holdout)
    trained = [i for blocks, _ in windows for block in blocks for i in block]
    expected = [i for i in range(total) if holdout is None or holdout.keeps(i)]
    assert trained == expected  # in order, each once
    if len(expected) >= world:
        assert all(block for blocks, _ in windows for block in blocks)
    ends = [end for _, end in windows]
    assert ends == sorted(set(ends))
    assert all(i < end for blocks, end in windows for block in blocks for i in block)
    if holdout is None:
        firsts = [min(i for block in blocks for i in block) for blocks, _ in windows]
        bounds = list(window_bounds(0, total, batch, world))
        assert [(f, end) for f, (_, end) in zip(firsts, windows)] == bounds


@given(
    total=st.integers(1, 200),
    batch=st.integers(1, 9),
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    cut=st.integers(0, 50),
    every=st.sampled_from([None, 3]),
)
def test_a_resume_on_another_world_size_continues_with_the_next_row(total, batch, worlds, cut, every):
    holdout = Holdout(every, batch) if every else None
    first = _epoch(list(range(total)), batch, worlds[0], holdout=holdout)
    done = first[: min(cut, len(first))]
    start = done[-1][1] if done else 0
    second = _epoch(list(range(total)), batch, worlds[1], start=start, holdout=holdout)
    seen = [i for blocks, _ in done + second for block in blocks for i in block]
    assert seen == [i for i in range(total) if holdout is None or holdout.keeps(i)]


def test_window_layout_and_drop_last():
    assert [rank_block(10, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    # 2 ranks x 3 rows: a remainder of one row (< 2 ranks) joins the last full window.
    assert list(window_bounds(0, 13, 3, 2)) == [(0, 6), (6, 13)]
    assert list(window_bounds(0, 14, 3, 2)) == [(0, 6), (6, 12), (12, 14)]
    assert list(window_bounds(0, 13, 3, 2, drop_last=True)) == [(0, 6), (6, 12)]
    kept = [(i, i) for i in range(13)]
    assert [len(w.rows) for w in rank_windows(kept, 3, 1, 2, drop_last=True)] == [3, 3]
    owned = list(rank_windows(kept, 3, 0, 2, owned=lambda k: k % 2 == 1))
    assert [(w.rows[0][0], w.end) for w in owned] == [(6, 13)]


def test_data_position_round_trips_and_names_bad_fields():
    position = DataPosition(2, 4096, "rows", "criteo")
    assert DataPosition.from_dict(position.to_dict()) == position
    with pytest.raises(ConfigError, match="manifest.json: data_position: DataPosition.offset"):
        DataPosition.from_dict({"epoch": 0, "offset": -1, "unit": "rows"}, "manifest.json: data_position")
    with pytest.raises(ConfigError, match="unit must be one of"):
        DataPosition(unit="lines")
    with pytest.raises(ConfigError, match="expected"):
        DataPosition.from_dict({"epoch": 0, "lines": 3})
