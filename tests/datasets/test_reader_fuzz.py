"""Readers under extreme values: one field of a valid row replaced by anything (huge or negative ints,
non-ASCII digits, NaN, long hex, missing or extra columns) either parses into in-range ids and finite dense
values or is a ``RowError`` naming its column; a file of them is read, or refused with file:line."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from rectrain.datasets import (
    CriteoConfig,
    CriteoDataset,
    MalformedRowError,
    MovieLensConfig,
    MovieLensDataset,
)
from rectrain.datasets.criteo import NUM_COLUMNS, parse_criteo_line
from rectrain.datasets.movielens import parse_rating_line
from rectrain.datasets.rows import INT64_MAX, RowError, parse_int
from rectrain.errors import ConfigError

EXTREME = [
    str(2**63),
    str(2**63 - 1),
    str(-(2**63) - 1),
    str(10**400),
    "9" * 5000,
    "-1",
    "1_000",
    "\u0661\u0662",  # Arabic-Indic digits: int() takes them
    "nan",
    "inf",
    "-inf",
    "1e400",
    "0x10",
    " 7 ",
    "",
    "f" * 65,
    "f" * 64,
    "-ff",
    "\x00",
]
fields = st.one_of(st.sampled_from(EXTREME), st.text(max_size=30), st.integers().map(str))
ROWS = [2, 3, 1000, 2**62]


def _criteo_line(rows: int) -> list[str]:
    return ["1", *[str(i) for i in range(13)], *[f"{i:08x}" for i in range(26)]]


@given(column=st.integers(0, NUM_COLUMNS), value=fields, rows=st.sampled_from(ROWS), extra=st.integers(-2, 2))
def test_criteo_line_parses_in_range_or_names_the_column(column, value, rows, extra):
    assume("\t" not in value)  # a tab in a value changes the column count: that is what ``extra`` tests
    cols = _criteo_line(rows)
    if column < NUM_COLUMNS:
        cols[column] = value
    if extra > 0:
        cols += ["0"] * extra
    elif extra < 0:
        cols = cols[:extra]
    try:
        label, dense, ids = parse_criteo_line("\t".join(cols), [rows] * 26)
    except RowError as error:
        assert error.column == "*" if extra else error.column == column + 1
        return
    assert extra == 0 and label in (0, 1)
    assert all(math.isfinite(x) and x >= 0 for x in dense)
    assert all(0 <= i < rows for i in ids)


@given(index=st.integers(0, 3), value=fields, layout=st.sampled_from(["dat", "csv"]))
@example(index=2, value=":", layout="dat")  # found by CI: the error names the timestamp
def test_rating_line_parses_in_range_or_names_the_column(index, value, layout):
    fields_ = ["12", "34", "4.5", "978300760"]
    fields_[index] = value
    separator = "::" if layout == "dat" else ","
    try:
        parsed = parse_rating_line(separator.join(fields_), layout)
    except RowError as error:
        # A value holding the separator's character moves text between fields ("4.5" -> ":" in
        # "12::34:::::978300760" leaves 4 fields, the last ":978300760"): any column may be the bad one.
        # Otherwise the field itself is named, or "*" where the value changed the field count.
        assert error.column in ((1, 2, 3, 4, "*") if separator[0] in value else (index + 1, "*"))
        return
    user, movie, rating = parsed
    assert 0 <= user <= INT64_MAX and 0 <= movie <= INT64_MAX and math.isfinite(rating)


@given(text=fields)
def test_parse_int_is_bounded(text):
    try:
        value = parse_int(text, 5, "x", low=-10, high=10)
    except RowError as error:
        assert error.column == 5 and "x" in str(error)
        return
    assert -10 <= value <= 10 and value == int(text)


def test_extreme_values_in_files_are_skipped_or_named_with_file_and_line(tmp_path):
    good = "\t".join(_criteo_line(10))
    bad = good.replace("\t5\t", f"\t{2**64}\t", 1)
    path = tmp_path / "day.tsv"
    path.write_text(f"{good}\n{bad}\n{good}\n")
    dataset = CriteoDataset(CriteoConfig(paths=[str(path)], num_embeddings=10))
    (batch,) = list(dataset)
    assert batch.labels.numel() == 2 and dataset.stats.rows_skipped == 1
    with pytest.raises(
        MalformedRowError, match=r"day\.tsv:2: column 7: integer feature int_5 18446744073709551616"
    ):
        list(CriteoDataset(CriteoConfig(paths=[str(path)], num_embeddings=10, strict=True)))

    ratings = tmp_path / "ratings.dat"
    ratings.write_text(f"1::2::5::0\n{2**63}::2::5::0\n3::-2::5::0\n")
    with pytest.raises(
        MalformedRowError, match=r"ratings\.dat:2: column 1: user_id 9223372036854775808 is larger"
    ):
        list(MovieLensDataset(MovieLensConfig(paths=[str(ratings)], strict=True)))
    dataset = MovieLensDataset(MovieLensConfig(paths=[str(ratings)], num_user_embeddings=2**62))
    (batch,) = list(dataset)
    assert batch.sparse_features["user_id"].values().tolist() == [1] and dataset.stats.rows_skipped == 2


@pytest.mark.parametrize("rows", [2**63, 1.5, True, 0])
def test_table_sizes_are_bounded(rows):
    with pytest.raises(ConfigError, match="num_embeddings"):
        CriteoConfig(paths=["x.tsv"], num_embeddings=rows)
    with pytest.raises(ConfigError, match="num_user_embeddings"):
        MovieLensConfig(paths=["ratings.dat"], num_user_embeddings=rows)
