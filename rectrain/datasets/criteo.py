"""Criteo display-advertising TSV (the Kaggle / Terabyte layout) as an iterable of ready ``Batch``es.

A row is 40 tab-separated columns: label (``0``/``1``), 13 integer features ``int_0..int_12`` (may be empty
or negative) and 26 categorical features ``cat_0..cat_25`` as hex strings (may be empty).

  dense        log(1 + max(x, 0)); empty -> 0
  categorical  id = 1 + int(hex, 16) % (rows - 1); empty -> 0, so row 0 of every table is "missing"

Rows are validated column by column (see ``rows`` for the malformed-row policy). Files may be plain or gzip.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from rectrain.datasets.batching import batch_from_arrays, make_batch, one_id_per_example
from rectrain.datasets.block_windows import block_windows
from rectrain.datasets.criteo_columns import parse_parts
from rectrain.datasets.criteo_rows import (  # noqa: F401 (the row format's names, re-exported)
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    MAX_HEX_DIGITS,
    MISSING_ID,
    NUM_COLUMNS,
    NUM_DENSE,
    NUM_SPARSE,
    hash_categorical,
    parse_criteo_line,
)
from rectrain.datasets.lines import TextDataset, log_skipped
from rectrain.datasets.rows import MAX_TABLE_ROWS, RowPolicy
from rectrain.datasets.sharding import worker_shard
from rectrain.datasets.windows import BatchAt
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch

logger = logging.getLogger(__name__)

PARSERS = ("columns", "lines")


@dataclass
class CriteoConfig:
    """Where the TSV files are and how to turn them into batches.

    ``num_embeddings``: rows of each categorical table (one int for all 26, or 26 ints), >= 2 since row 0 is
    reserved for missing values. ``strict``: raise on the first malformed row instead of skipping it.
    ``parser``: ``"columns"`` parses blocks of lines with NumPy (``criteo_columns``); ``"lines"`` parses one
    line at a time in Python (the reference: both give the same batches and report the same bad rows).
    """

    paths: list[str]
    batch_size: int = 1024
    num_embeddings: int | list[int] = 100_000
    drop_last: bool = False
    strict: bool = False
    cat_feature_names: list[str] = field(default_factory=lambda: list(DEFAULT_CAT_NAMES))
    parser: str = "columns"

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):
            raise ConfigError("CriteoConfig.paths must be a list of file paths, got a single string")
        if not self.paths:
            raise ConfigError("CriteoConfig.paths is empty; give at least one .tsv or .tsv.gz file")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"CriteoConfig.batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.parser not in PARSERS:
            raise ConfigError(f"CriteoConfig.parser must be one of {PARSERS}, got {self.parser!r}")
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


class CriteoDataset(TextDataset[tuple[int, list[float], list[int]]]):
    """Batches of this rank's and DataLoader worker's share of the files: its block of every global window
    (see ``lines.TextDataset``), from row ``start_row`` on, of the rows ``select`` keeps (default: all).

    ``config.parser="columns"`` parses the lines of this reader's blocks with NumPy (``criteo_columns``),
    ``"lines"`` one at a time in Python; both give the same batches at the same positions.
    """

    config: CriteoConfig

    @functools.cached_property
    def _rows(self) -> list[int]:
        return self.config.table_rows()

    def parse_line(self, line: str, path: str) -> tuple[int, list[float], list[int]]:
        return parse_criteo_line(line, self._rows)

    def windows(self) -> Iterator[BatchAt]:
        if self.config.parser == "lines":
            return super().windows()
        return self._column_windows()

    def _column_windows(self) -> Iterator[BatchAt]:
        cfg, worker = self.config, worker_shard(self.rank, self.world_size)
        policy = RowPolicy(self.stats, cfg.strict)
        for rows, end in block_windows(
            cfg.paths,
            lambda parts: parse_parts(parts, self._rows, policy),
            batch_size=cfg.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            owned=worker.owns,
            start_row=self.start_row,
            select=self.select,
            drop_last=cfg.drop_last,
        ):
            yield BatchAt(batch_from_arrays(cfg.cat_feature_names, rows.labels, rows.dense, rows.ids.T), end)
        log_skipped(self.stats, self.rank, worker)

    def make_batch(self, rows: list[tuple[int, list[float], list[int]]]) -> Batch:
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


# TorchRec's names at this path (``torchrec.datasets.criteo``): its raw-row TSV stream and its .npy tools.
from rectrain.datasets.criteo_in_memory import InMemoryBinaryCriteoIterDataPipe  # noqa: E402, F401
from rectrain.datasets.criteo_npy import BinaryCriteoUtils  # noqa: E402, F401
from rectrain.datasets.criteo_tsv import (  # noqa: E402, F401, F401
    CAT_FEATURE_COUNT,
    DAYS,
    DEFAULT_COLUMN_NAMES,
    DEFAULT_LABEL_NAME,
    FREQUENCY_THRESHOLD,
    INT_FEATURE_COUNT,
    TOTAL_TRAINING_SAMPLES,
    CriteoIterDataPipe,
    criteo_kaggle,
    criteo_terabyte,
)
