"""Criteo TSV rows parsed a block at a time with NumPy: the rows, values and errors of ``parse_criteo_line``.

Per block of lines (``line_blocks``), the lines a reader wants are split at their tabs and every field is
decoded from the (up to) 16 bytes that end it, read as little-endian 64-bit words and turned into numbers with
bit arithmetic (SWAR: eight characters per integer operation). The fast path takes the common shape:

  label      exactly ``0`` or ``1``
  integer    empty, or an optional sign and 1..16 ASCII digits
  hex        empty, or 1..16 hex digits (the value fits 64 bits, so ``1 + v % (rows - 1)`` is exact)

Any other line (a wrong column count, spaces, 17+ digits, non-ASCII, ...) goes to ``parse_criteo_line``, which
accepts it or raises the ``RowError`` the line-by-line reader reports, so both readers keep the same rows with
the same values and report the same malformed lines. Dense values are bitwise those of the line-by-line
reader (``log1p_exact``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rectrain.datasets.block_windows import BlockLines
from rectrain.datasets.criteo_rows import NUM_DENSE, NUM_SPARSE, parse_criteo_line
from rectrain.datasets.line_blocks import DEFAULT_BLOCK_BYTES, LineBlock, iter_line_blocks
from rectrain.datasets.rows import RowError, RowPolicy, RowStats

_U = np.uint64
_M8, _M16, _M32 = _U(0x00FF00FF00FF00FF), _U(0x0000FFFF0000FFFF), _U(0xFFFFFFFF)
_LOW_NIBBLES, _ONES, _HIGH_BITS = _U(0x0F0F0F0F0F0F0F0F), _U(0x0101010101010101), _U(0x8080808080808080)
_ZERO_CHARS, _LOWER = _U(0x3030303030303030), _U(0x2020202020202020)
# KEEP[n]: the last n bytes of a little-endian word (the n characters that end a field).
_KEEP = np.array([0] + [((1 << 8 * n) - 1) << 8 * (8 - n) for n in range(1, 9)], dtype=np.uint64)
_TABS = NUM_DENSE + NUM_SPARSE  # tabs in a line of 40 columns
_ULPS_WINDOW = 2.0**-49  # 8 float64 ulps, relative
_MAX_FAST_DIGITS = 16


@dataclass
class CriteoColumns:
    """Parsed rows in line order: labels ``[n]`` and dense ``[n, 13]`` float32, ids ``[n, 26]`` int64."""

    labels: np.ndarray
    dense: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, index: np.ndarray | slice) -> CriteoColumns:
        return CriteoColumns(self.labels[index], self.dense[index], self.ids[index])


@dataclass
class ParsedBlock:
    """A block's good rows, and its malformed lines as ``(1-based line in the file, error)``."""

    columns: CriteoColumns
    errors: list[tuple[int, RowError]]


def log1p_exact(values: np.ndarray) -> np.ndarray:
    """float32(math.log1p(x)) of non-negative int64 ``values``, as the line-by-line reader computes it.

    NumPy's log1p may differ from the C library's in the last bits of a float64, which changes the float32
    only when the value sits at a float32 rounding boundary: those few (where a window of +-8 float64 ulps
    rounds two ways) are recomputed with ``math.log1p``.
    """
    exact = np.log1p(values.astype(np.float64))
    out = exact.astype(np.float32)
    low = (exact * (1 - _ULPS_WINDOW)).astype(np.float32)
    high = (exact * (1 + _ULPS_WINDOW)).astype(np.float32)
    unsure = np.flatnonzero((low != out) | (high != out))
    if len(unsure):
        out[unsure] = np.array([math.log1p(int(x)) for x in values[unsure]], dtype=np.float64)
    return out


def _word(words: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The 8 bytes that end at ``end``, the bytes before the last ``length`` replaced by ``"0"``."""
    keep = _KEEP[np.clip(length, 0, 8)]
    return (words[end - 8] & keep) | (_ZERO_CHARS & ~keep)


def _digit_bits(x: np.ndarray) -> np.ndarray:
    """High bit of each byte set when the byte is an ASCII digit (bytes must be < 0x80)."""
    return (x + _U(0x5050505050505050)) & ~(x + _U(0x4646464646464646))


def is_hex_word(x: np.ndarray) -> np.ndarray:
    """Whether all 8 bytes of each word are ASCII hex digits."""
    lower = x | _LOWER
    letters = (lower + _U(0x1F1F1F1F1F1F1F1F)) & ~(lower + _U(0x1919191919191919))
    return (((_digit_bits(x) | letters) & _HIGH_BITS) == _HIGH_BITS) & ((x & _HIGH_BITS) == 0)


def is_digit_word(x: np.ndarray) -> np.ndarray:
    """Whether all 8 bytes of each word are ASCII decimal digits."""
    return ((_digit_bits(x) & _HIGH_BITS) == _HIGH_BITS) & ((x & _HIGH_BITS) == 0)


def hex_value(x: np.ndarray) -> np.ndarray:
    """The value of 8 hex digits (first byte most significant) as uint64."""
    x = (x & _LOW_NIBBLES) + _U(9) * ((x >> _U(6)) & _ONES)
    x = ((x & _M8) << _U(4)) | ((x >> _U(8)) & _M8)
    x = ((x & _M16) << _U(8)) | ((x >> _U(16)) & _M16)
    return ((x & _M32) << _U(16)) | (x >> _U(32))


def decimal_value(x: np.ndarray) -> np.ndarray:
    """The value of 8 decimal digits (first byte most significant) as uint64."""
    x = x & _LOW_NIBBLES
    x = (x & _M8) * _U(10) + ((x >> _U(8)) & _M8)
    x = (x & _M16) * _U(100) + ((x >> _U(16)) & _M16)
    return (x & _M32) * _U(10000) + (x >> _U(32))


def _fields(block: LineBlock, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``lines`` (indices into the block): which have 40 columns, and those lines' field starts/ends."""
    buf, starts, ends = block.buf, block.starts[lines], block.ends[lines]
    tabs = np.flatnonzero(buf == 9)
    first = np.searchsorted(tabs, starts)
    shaped = np.searchsorted(tabs, ends) - first == _TABS
    if shaped.all() and len(tabs) == _TABS * len(block) and len(lines) == len(block):
        at = tabs.reshape(len(block), _TABS)  # every line of the block: no gather needed
    else:
        at = tabs[first[shaped, None] + np.arange(_TABS)]
    field_starts = np.concatenate([starts[shaped, None], at + 1], axis=1)
    field_ends = np.concatenate([at, ends[shaped, None]], axis=1)
    return shaped, field_starts, field_ends


def _decode_dense(
    buf: np.ndarray, words: np.ndarray, fs: np.ndarray, fe: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rows whose 13 integer fields the fast path takes, the integers after max(x, 0))."""
    length = fe - fs
    first = buf[fs]
    signed = (length > 0) & ((first == ord("-")) | (first == ord("+")))
    digits = length - signed
    ok = ((digits <= _MAX_FAST_DIGITS) & ((length == 0) | (digits > 0))).all(axis=1)
    low = _word(words, fe, digits)
    good = is_digit_word(low)
    value = decimal_value(low)
    long = digits > 8  # rare: characters 9..16 from the end need a second word
    if long.any():
        high = _word(words, fe[long] - 8, digits[long] - 8)
        good[long] &= is_digit_word(high)
        value[long] += decimal_value(high) * _U(100_000_000)
    ok &= good.all(axis=1)
    value = value.astype(np.int64)
    value[first == ord("-")] = 0  # max(x, 0)
    return ok, value


def _decode_ids(
    words: np.ndarray, fs: np.ndarray, fe: np.ndarray, modulus: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rows whose 26 hex fields the fast path takes, their ids)."""
    length = fe - fs
    ok = (length <= _MAX_FAST_DIGITS).all(axis=1)
    low = _word(words, fe, length)
    good = is_hex_word(low)
    value = hex_value(low)
    long = length > 8
    if long.any():
        high = _word(words, fe[long] - 8, length[long] - 8)
        good[long] &= is_hex_word(high)
        value[long] |= hex_value(high) << _U(32)
    ok &= good.all(axis=1)
    ids = (value % modulus).astype(np.int64) + 1
    ids[length == 0] = 0
    return ok, ids


def _fast_rows(block: LineBlock, lines: np.ndarray, modulus: np.ndarray):
    """(rows taken by the fast path, their labels, dense values, ids)."""
    buf = block.buf
    words = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))
    shaped, fs, fe = _fields(block, lines)
    label = buf[fs[:, 0]]
    ok = (fe[:, 0] - fs[:, 0] == 1) & ((label == ord("0")) | (label == ord("1")))
    dense_ok, dense_ints = _decode_dense(buf, words, fs[:, 1 : 1 + NUM_DENSE], fe[:, 1 : 1 + NUM_DENSE])
    ids_ok, ids = _decode_ids(words, fs[:, 1 + NUM_DENSE :], fe[:, 1 + NUM_DENSE :], modulus)
    ok &= dense_ok & ids_ok
    taken = np.flatnonzero(shaped)[ok]
    dense = log1p_exact(dense_ints[ok].reshape(-1)).reshape(-1, NUM_DENSE)
    return taken, (label[ok] == ord("1")).astype(np.float32), dense, ids[ok]


def parse_block(block: LineBlock, rows: Sequence[int], lines: np.ndarray) -> ParsedBlock:
    """Lines ``lines`` (indices into ``block``, increasing) parsed; the lines the fast path leaves go through
    the exact line parser."""
    modulus = np.asarray(rows, dtype=np.uint64) - _U(1)
    taken, labels, dense, ids = _fast_rows(block, lines, modulus)
    if len(taken) == len(lines):
        return ParsedBlock(CriteoColumns(labels, dense, ids), [])
    n = len(lines)
    out = CriteoColumns(
        np.empty(n, np.float32), np.empty((n, NUM_DENSE), np.float32), np.empty((n, NUM_SPARSE), np.int64)
    )
    out.labels[taken], out.dense[taken], out.ids[taken] = labels, dense, ids
    good = np.zeros(n, dtype=bool)
    good[taken] = True
    errors: list[tuple[int, RowError]] = []
    for i in np.flatnonzero(~good).tolist():
        try:
            out.labels[i], out.dense[i], out.ids[i] = parse_criteo_line(block.line_text(lines[i]), rows)
            good[i] = True
        except RowError as e:
            errors.append((block.first_line + int(lines[i]) + 1, e))
    return ParsedBlock(out.take(good), errors)


def iter_criteo_columns(
    path: str | Path,
    rows: Sequence[int],
    stats: RowStats,
    *,
    strict: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[CriteoColumns]:
    """Every line of ``path`` parsed, in column blocks in order (the converter's reader); malformed lines go
    to ``RowPolicy``, reported with their 1-based line in the file."""
    policy = RowPolicy(stats, strict)
    for block in iter_line_blocks(path, block_bytes):
        parsed = parse_block(block, rows, np.arange(len(block)))
        for line, error in parsed.errors:
            policy.bad_row(str(path), line, error)
        stats.rows_read += len(parsed.columns)
        if len(parsed.columns):
            yield parsed.columns


def concat_columns(parts: Sequence[CriteoColumns]) -> CriteoColumns:
    """One block of the rows of ``parts``, in order."""
    if len(parts) == 1:
        return parts[0]
    return CriteoColumns(
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.ids for p in parts]),
    )


def parse_parts(parts: Sequence[BlockLines], rows: Sequence[int], policy: RowPolicy) -> CriteoColumns:
    """The lines of ``parts`` parsed into one block (a reader's batch of a window); malformed lines go to
    ``policy``."""
    columns = []
    for part in parts:
        parsed = parse_block(part.block, rows, part.lines)
        for line, error in parsed.errors:
            policy.bad_row(part.path, line, error)
        policy.stats.rows_read += len(parsed.columns)
        columns.append(parsed.columns)
    if not columns:
        return CriteoColumns(
            np.empty(0, np.float32), np.empty((0, NUM_DENSE), np.float32), np.empty((0, NUM_SPARSE), np.int64)
        )
    return concat_columns(columns)
