"""Criteo display-advertising TSV (the Kaggle / Terabyte layout) as an iterable of ready ``Batch``es.

A row is 40 tab-separated columns: label (``0``/``1``), 13 integer features ``int_0..int_12`` (may be empty
or negative) and 26 categorical features ``cat_0..cat_25`` as hex strings (may be empty).

  dense        log(1 + max(x, 0)); empty -> 0
  categorical  id = 1 + int(hex, 16) % (rows - 1); empty -> 0, so row 0 of every table is "missing"

Rows are validated column by column (see ``rows`` for the malformed-row policy). Files may be plain or gzip.
"""

from __future__ import annotations

import logging
import math
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.data import IterableDataset

from rectrain.datasets.batching import make_batch, one_id_per_example
from rectrain.datasets.lines import text_windows
from rectrain.datasets.rows import MAX_TABLE_ROWS, RowError, RowStats, parse_int
from rectrain.datasets.sharding import check_rank
from rectrain.datasets.windows import BatchAt, Holdout
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch

logger = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE
DEFAULT_INT_NAMES = [f"int_{i}" for i in range(NUM_DENSE)]
DEFAULT_CAT_NAMES = [f"cat_{i}" for i in range(NUM_SPARSE)]
MISSING_ID = 0
MAX_HEX_DIGITS = 64  # Criteo's are 8; a longer string is garbage, and int(., 16) of it costs its length
_HEX = frozenset(string.hexdigits)


@dataclass
class CriteoConfig:
    """Where the TSV files are and how to turn them into batches.

    ``num_embeddings``: rows of each categorical table (one int for all 26, or 26 ints), >= 2 since row 0 is
    reserved for missing values. ``strict``: raise on the first malformed row instead of skipping it.
    """

    paths: list[str]
    batch_size: int = 1024
    num_embeddings: int | list[int] = 100_000
    drop_last: bool = False
    strict: bool = False
    cat_feature_names: list[str] = field(default_factory=lambda: list(DEFAULT_CAT_NAMES))

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):
            raise ConfigError("CriteoConfig.paths must be a list of file paths, got a single string")
        if not self.paths:
            raise ConfigError("CriteoConfig.paths is empty; give at least one .tsv or .tsv.gz file")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"CriteoConfig.batch_size must be an int >= 1, got {self.batch_size!r}")
        if len(self.cat_feature_names) != NUM_SPARSE:
            raise ConfigError(f"CriteoConfig.cat_feature_names needs {NUM_SPARSE} names")
        rows = self.table_rows()
        if any(isinstance(r, bool) or not isinstance(r, int) or not 2 <= r <= MAX_TABLE_ROWS for r in rows):
            raise ConfigError(
                f"CriteoConfig.num_embeddings must be ints in [2, 2**62] (row 0 means missing), got {rows}"
            )

    def table_rows(self) -> list[int]:
        """Rows of each categorical table, in feature order."""
        if not isinstance(self.num_embeddings, (list, tuple)):
            return [self.num_embeddings] * NUM_SPARSE
        if len(self.num_embeddings) != NUM_SPARSE:
            raise ConfigError(
                f"CriteoConfig.num_embeddings has {len(self.num_embeddings)} entries; give one int or "
                f"{NUM_SPARSE} ints"
            )
        return list(self.num_embeddings)


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


class CriteoDataset(IterableDataset):
    """Batches of this rank's and DataLoader worker's share of the files: its block of every global window
    (see ``windows``), from row ``start_row`` on, of the rows ``select`` keeps (default: all).

    Use ``DataLoader(dataset, batch_size=None, num_workers=N)``: workers take turns by window, so the batches
    are the same whatever ``N``. ``windows()`` also gives each batch's data position. ``stats`` counts rows
    read and skipped in this process.
    """

    def __init__(
        self,
        config: CriteoConfig,
        rank: int = 0,
        world_size: int = 1,
        *,
        start_row: int = 0,
        select: Holdout | None = None,
    ) -> None:
        check_rank(rank, world_size)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.start_row, self.select = start_row, select
        self.stats = RowStats()
        self._rows = config.table_rows()

    def _parse(self, line: str, path: str) -> tuple[int, list[float], list[int]]:
        return parse_criteo_line(line, self._rows)

    def windows(self) -> Iterator[BatchAt]:
        """This reader's batch of each window it owns, with the row index after the window."""
        cfg = self.config
        for window in text_windows(
            cfg.paths,
            self._parse,
            self.stats,
            batch_size=cfg.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            start_row=self.start_row,
            select=self.select,
            drop_last=cfg.drop_last,
            strict=cfg.strict,
        ):
            yield BatchAt(self._batch([row for _, row in window.rows]), window.end)

    def __iter__(self) -> Iterator[Batch]:
        return (item.batch for item in self.windows())

    def _batch(self, rows: list[tuple[int, list[float], list[int]]]) -> Batch:
        keys = self.config.cat_feature_names
        labels, dense, ids = zip(*rows) if rows else ((), (), ())
        ids_tensor = torch.tensor(ids, dtype=torch.int64).reshape(len(rows), NUM_SPARSE)
        values, lengths = one_id_per_example(keys, ids_tensor)
        return make_batch(
            dense=torch.tensor(dense, dtype=torch.float32).reshape(len(rows), NUM_DENSE),
            keys=keys,
            values=values,
            lengths=lengths,
            labels=torch.tensor(labels, dtype=torch.float32),
        )
