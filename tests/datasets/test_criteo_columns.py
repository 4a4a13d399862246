"""The vectorised Criteo reader against the line-by-line one: the same lines (any line endings, any block
size), the same rows and values bit for bit, the same malformed lines reported (file:line, column, strict)."""

from __future__ import annotations

import gzip
import io
import logging
import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from rectrain.datasets import CriteoConfig, CriteoDataset, MalformedRowError, build_dataset
from rectrain.datasets.criteo import NUM_COLUMNS, parse_criteo_line
from rectrain.datasets.criteo_columns import (
    decimal_value,
    hex_value,
    is_digit_word,
    is_hex_word,
    log1p_exact,
    parse_block,
)
from rectrain.datasets.line_blocks import line_blocks_of, split_lines
from rectrain.datasets.rows import RowError
from rectrain.datasets.windows import Holdout
from tests.datasets.test_reader_fuzz import EXTREME


def text_mode_lines(data: bytes) -> list[str]:
    """The lines the line-by-line readers see (``open(..., newline="")``, terminators stripped)."""
    f = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="")
    return [line.rstrip("\r\n") for line in f]


def block_lines(data: bytes, block_bytes: int) -> list[str]:
    """The lines ``line_blocks_of`` finds in ``data`` read ``block_bytes`` at a time."""
    out, first = [], 0
    for block in line_blocks_of(io.BytesIO(data), block_bytes):
        assert block.first_line == first
        first += len(block)
        out += [block.line_text(i) for i in range(len(block))]
    return out


@given(
    pieces=st.lists(st.sampled_from([b"a", b"\t", b"\n", b"\r", b"\r\n", b"\xff", b"\xc3", b"\xc3\xa9"])),
    block_bytes=st.integers(1, 12),
)
def test_lines_split_as_text_mode_splits_them(pieces, block_bytes):
    data = b"".join(pieces)
    assert block_lines(data, block_bytes) == text_mode_lines(data)


def _words(strings: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(s.rjust(8, b"0") for s in strings), dtype="<u8")


def test_word_checks_and_values_match_python_for_every_byte():
    for byte in range(256):
        word = bytes([byte]) * 8
        char = chr(byte)
        assert is_hex_word(_words([word]))[0] == (char in "0123456789abcdefABCDEF"), byte
        assert is_digit_word(_words([word]))[0] == (char in "0123456789"), byte
    rng = random.Random(0)
    hexes = [format(rng.randrange(16**8), "x").encode() for _ in range(200)] + [b"FFFFFFFF", b"aBc"]
    assert hex_value(_words(hexes)).tolist() == [int(h, 16) for h in hexes]
    digits = [str(rng.randrange(10**8)).encode() for _ in range(200)] + [b"99999999", b"7"]
    assert decimal_value(_words(digits)).tolist() == [int(d) for d in digits]


def test_log1p_is_math_log1p_bit_for_bit():
    rng = np.random.default_rng(0)
    values = np.concatenate([np.arange(1 << 17), rng.integers(0, 10**16, 1 << 17), [10**16 - 1]])
    expected = np.array([math.log1p(int(v)) for v in values], dtype=np.float64).astype(np.float32)
    assert np.array_equal(log1p_exact(values), expected)


def _good_fields(rng: random.Random) -> list[str]:
    dense = [
        rng.choice(["", str(rng.randrange(10 ** rng.randint(1, 16))), f"-{rng.randrange(99)}"])
        for _ in range(13)
    ]
    cats = [rng.choice(["", format(rng.randrange(16 ** rng.randint(1, 16)), "x")]) for _ in range(26)]
    return [rng.choice("01"), *dense, *cats]


fields = st.one_of(st.sampled_from(EXTREME), st.text(max_size=20), st.integers().map(str))


@given(
    seed=st.integers(0, 2**32),
    column=st.integers(0, NUM_COLUMNS),
    value=fields,
    extra=st.integers(-1, 1),
    rows=st.sampled_from([2, 1000, 2**62]),
)
def test_a_block_parses_as_the_line_parser_parses_each_line(seed, column, value, extra, rows):
    rng = random.Random(seed)
    lines = ["\t".join(_good_fields(rng)) for _ in range(3)]
    cols = _good_fields(rng)
    if column < NUM_COLUMNS:
        cols[column] = value
    cols = cols + ["0"] * extra if extra >= 0 else cols[:extra]
    lines.insert(1, "\t".join(cols))
    data = "\n".join(lines).encode("utf-8", errors="surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return  # hypothesis text with lone surrogates: not a file anyone can write
    texts = text_mode_lines(data)
    block = split_lines(data, 0)
    parsed = parse_block(block, [rows] * 26, np.arange(len(block)))
    expected_rows, expected_errors = [], []
    for number, text in enumerate(texts, start=1):
        try:
            expected_rows.append(parse_criteo_line(text, [rows] * 26))
        except RowError as e:
            expected_errors.append((number, e.column, str(e)))
    assert [(n, e.column, str(e)) for n, e in parsed.errors] == expected_errors
    got = parsed.columns
    assert got.labels.tolist() == [float(r[0]) for r in expected_rows]
    assert np.array_equal(
        got.dense, np.array([r[1] for r in expected_rows], np.float64).astype(np.float32).reshape(-1, 13)
    )
    assert got.ids.tolist() == [r[2] for r in expected_rows]


def _rows(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["\t".join(_good_fields(rng)) for _ in range(n)]


def _batches(config: CriteoConfig, parser: str, rank: int = 0, world_size: int = 1, workers: int = 0):
    cfg = CriteoConfig(**{**config.__dict__, "parser": parser})
    dataset = build_dataset(cfg, rank, world_size)
    return list(DataLoader(dataset, batch_size=None, num_workers=workers)) if workers else list(dataset)


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.labels, y.labels)
        assert torch.equal(x.dense_features, y.dense_features)
        assert x.sparse_features.keys() == y.sparse_features.keys()
        assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
        assert torch.equal(x.sparse_features.lengths(), y.sparse_features.lengths())


def test_files_give_the_line_readers_batches_with_any_endings_gzip_ranks_and_workers(tmp_path):
    rows = _rows(300)
    rows[7] = "not\ta\trow"
    rows[50] = rows[50].replace("\t", "\t 1 ", 1)  # a spaced integer: the line parser takes it
    text = "\r\n".join(rows[:100]) + "\n" + "\r".join(rows[100:200]) + "\r\n" + "\n".join(rows[200:])
    plain = tmp_path / "day.tsv"
    plain.write_bytes(text.encode())
    with gzip.open(tmp_path / "day.tsv.gz", "wb") as f:
        f.write(text.encode())
    for path in (plain, tmp_path / "day.tsv.gz"):
        config = CriteoConfig(paths=[str(path), str(plain)], batch_size=32, num_embeddings=997)
        assert_same_batches(_batches(config, "columns"), _batches(config, "lines"))
        for rank in range(2):
            assert_same_batches(_batches(config, "columns", rank, 2), _batches(config, "lines", rank, 2))
    config = CriteoConfig(paths=[str(plain)], batch_size=16, num_embeddings=997)
    assert_same_batches(
        _batches(config, "columns", 1, 2, workers=2), _batches(config, "lines", 1, 2, workers=2)
    )


def test_malformed_lines_are_warned_counted_or_raised_the_same(tmp_path, caplog):
    rows = _rows(40)
    rows[3] = rows[3].replace("\t", "\tx", 1)
    rows[30] = "2" + rows[30][1:]
    path = tmp_path / "bad.tsv"
    path.write_text("\n".join(rows) + "\n")
    config = CriteoConfig(paths=[str(path)], batch_size=8)
    logs = {}
    for parser in ("columns", "lines"):
        caplog.clear()
        dataset = CriteoDataset(CriteoConfig(**{**config.__dict__, "parser": parser}))
        with caplog.at_level(logging.WARNING):
            batches = list(dataset)
        logs[parser] = sorted(r.getMessage() for r in caplog.records)
        assert (dataset.stats.rows_read, dataset.stats.rows_skipped) == (38, 2)
        assert dict(dataset.stats.skipped_by_column) == {2: 1, 1: 1}
        assert [len(b.labels) for b in batches] == [7, 8, 8, 7, 8]  # a malformed line is a row of its window
    assert logs["columns"] == logs["lines"]
    assert any(f"{path}:4: column 2" in m for m in logs["columns"])
    for parser in ("columns", "lines"):
        strict = CriteoDataset(CriteoConfig(**{**config.__dict__, "parser": parser, "strict": True}))
        seen = []
        with pytest.raises(MalformedRowError, match=r"bad\.tsv:4: column 2: integer feature int_0"):
            for batch in strict:
                seen.append(batch)
        assert seen == []  # the bad line comes before the first full batch


def test_config_rejects_an_unknown_parser():
    with pytest.raises(ValueError, match="parser"):
        CriteoConfig(paths=["x.tsv"], parser="fast")


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_windows_from_any_start_with_a_holdout_match_the_line_reader(tmp_path, world_size):
    rows = _rows(130, seed=world_size)
    rows[20] = "bad"
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text("\n".join(rows[:61]) + "\n")
    second.write_text("\n".join(rows[61:]))
    paths = [str(first), str(second)]
    for start_row, select, drop_last in [
        (0, None, False),
        (37, None, False),
        (0, Holdout(4, 5), False),
        (11, Holdout(4, 5, held_out=True), False),
        (3, Holdout(3, 5), True),
    ]:
        for rank in range(world_size):
            got = {}
            for parser in ("columns", "lines"):
                config = CriteoConfig(
                    paths=paths, batch_size=5, num_embeddings=997, drop_last=drop_last, parser=parser
                )
                dataset = CriteoDataset(config, rank, world_size, start_row=start_row, select=select)
                got[parser] = list(dataset.windows())
            assert [w.end for w in got["columns"]] == [w.end for w in got["lines"]]
            assert_same_batches([w.batch for w in got["columns"]], [w.batch for w in got["lines"]])
