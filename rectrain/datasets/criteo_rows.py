"""The Criteo TSV row format: one line -> ``(label, 13 dense values, 26 ids)``, the reference parser.

A row is 40 tab-separated columns: label (``0``/``1``), 13 integer features ``int_0..int_12`` (may be empty
or negative) and 26 categorical features ``cat_0..cat_25`` as hex strings (may be empty). ``criteo`` (the
dataset) and ``criteo_columns`` (the NumPy block parser, which falls back to this one) both read it.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

from rectrain.datasets.rows import RowError, parse_int

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE
DEFAULT_INT_NAMES = [f"int_{i}" for i in range(NUM_DENSE)]
DEFAULT_CAT_NAMES = [f"cat_{i}" for i in range(NUM_SPARSE)]
MISSING_ID = 0
MAX_HEX_DIGITS = 64  # Criteo's are 8; a longer string is garbage, and int(., 16) of it costs its length
_HEX = frozenset(string.hexdigits)


def hash_categorical(value: str, rows: int) -> int:
    """The documented id of a categorical hex string in a table of ``rows`` rows (``""`` -> 0)."""
    if value == "":
        return MISSING_ID
    return 1 + int(value, 16) % (rows - 1)


def parse_criteo_line(line: str, rows: Sequence[int]) -> tuple[int, list[float], list[int]]:
    """``(label, 13 dense values after log1p, 26 ids)`` of one line; ``RowError`` (1-based column) if bad."""
    cols = line.split("\t")
    if len(cols) != NUM_COLUMNS:
        raise RowError("*", f"expected {NUM_COLUMNS} tab-separated columns, got {len(cols)}")
    if cols[0] not in ("0", "1"):
        raise RowError(1, f"label must be 0 or 1, got {cols[0]!r}")
    dense = []
    for i, text in enumerate(cols[1 : 1 + NUM_DENSE]):
        x = parse_int(text, 2 + i, f"integer feature {DEFAULT_INT_NAMES[i]}") if text else 0
        dense.append(math.log1p(max(x, 0)))
    ids = []
    for i, text in enumerate(cols[1 + NUM_DENSE :]):
        if len(text) > MAX_HEX_DIGITS or not _HEX.issuperset(text):
            shown = f"{text[:40]!r}{'...' if len(text) > 40 else ''}"
            raise RowError(
                2 + NUM_DENSE + i,
                f"categorical feature cat_{i} is not hex of <= {MAX_HEX_DIGITS} digits: {shown}",
            )
        ids.append(hash_categorical(text, rows[i]))
    return int(cols[0]), dense, ids
