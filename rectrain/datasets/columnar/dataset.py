"""``ColumnarDataset``: batches of converted data or users' Parquet, rank-sharded by row ranges.

Batches are cut from the epoch's row order (``plan``): rank ``r`` of ``W`` reads positions ``start + s*B*W +
r*B ..`` for step ``s``, so the data position is one global number. ``start_at(position)`` (or the
``start_offset`` argument) makes the next pass begin there, for any world size: a job that consumed ``n``
examples of an epoch resumes with ``start_at(n)`` on 1, 2 or 3 ranks and reads every remaining row once.
DataLoader workers split a rank's batches round-robin (batch ``i`` to worker ``i % workers``), so the batches
and their order do not depend on the number of workers. Each batch is a few array copies: no per-row Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from torch.utils.data import IterableDataset

from rectrain.datasets.columnar.columns import Columns, columns_to_batch, concat_columns
from rectrain.datasets.columnar.converted import ConvertedSource
from rectrain.datasets.columnar.parquet import ParquetSource
from rectrain.datasets.columnar.plan import (
    DEFAULT_SHUFFLE_BLOCK_ROWS,
    RowOrder,
    batches_per_rank,
    rank_ranges,
)
from rectrain.datasets.sharding import check_rank, worker_shard
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch

FORMATS = ("converted", "parquet")


@dataclass
class ColumnarConfig:
    """Converted directories (``format = "converted"``) or Parquet files (``"parquet"``), and how to batch.

    ``table_rows``: rows of each sparse feature's table, in feature order. Converted data were hashed into
    sizes recorded in their manifest; when given, they must match. Parquet ids are taken modulo these sizes
    (required). Parquet needs ``sparse_columns`` (their names are the features) and, when the model has dense
    inputs, ``dense_columns``. ``label_threshold``: labels become ``label >= threshold`` (MovieLens ratings).
    ``shuffle``: each epoch reads blocks of ``shuffle_block_rows`` rows in an order drawn from (seed, epoch).
    """

    paths: list[str]
    format: str = "converted"
    batch_size: int = 1024
    drop_last: bool = False
    label_column: str = "label"
    dense_columns: list[str] = field(default_factory=list)
    sparse_columns: list[str] = field(default_factory=list)
    table_rows: list[int] | None = None
    label_threshold: float | None = None
    shuffle: bool = False
    shuffle_block_rows: int = DEFAULT_SHUFFLE_BLOCK_ROWS
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.paths, str) or not self.paths:
            raise ConfigError("ColumnarConfig.paths must be a non-empty list of paths")
        if self.format not in FORMATS:
            raise ConfigError(f"ColumnarConfig.format must be one of {FORMATS}, got {self.format!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"ColumnarConfig.batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.format == "parquet" and not self.sparse_columns:
            raise ConfigError("ColumnarConfig.sparse_columns: name the Parquet columns holding ids")
        if self.format == "parquet" and self.table_rows is None:
            raise ConfigError("ColumnarConfig.table_rows: Parquet ids need the table sizes to hash into")


def open_source(config: ColumnarConfig) -> ConvertedSource | ParquetSource:
    """The row source of ``config``, checked against its expectations (ConfigError/DataFileError if not)."""
    if config.format == "parquet":
        assert config.table_rows is not None
        return ParquetSource(
            config.paths, config.label_column, config.dense_columns, config.sparse_columns, config.table_rows
        )
    source = ConvertedSource(config.paths)
    m = source.manifest
    if config.table_rows is not None and list(config.table_rows) != list(m.table_rows):
        wrong = [
            f"{name}: {have} (table has {want})"
            for name, have, want in zip(m.sparse_features, m.table_rows, config.table_rows)
            if have != want
        ]
        raise ConfigError(
            f"{config.paths[0]}: ids were hashed into other table sizes than the model's: "
            f"{', '.join(wrong[:4])}{' ...' if len(wrong) > 4 else ''}; convert again with the model's sizes "
            "(rectrain data convert --config RUN_TOML)"
        )
    return source


class ColumnarDataset(IterableDataset):
    """This rank's batches of a columnar source; use with ``DataLoader(ds, batch_size=None)``."""

    def __init__(
        self, config: ColumnarConfig, rank: int = 0, world_size: int = 1, start_offset: int = 0
    ) -> None:
        check_rank(rank, world_size)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.source = open_source(config)
        if isinstance(self.source, ConvertedSource):
            self.feature_names = list(self.source.manifest.sparse_features)
            self.dense_names = list(self.source.manifest.dense_features)
        else:
            self.feature_names, self.dense_names = list(config.sparse_columns), list(config.dense_columns)
        self.epoch = 0
        self.start_offset = 0
        self.start_at(start_offset)

    @property
    def num_rows(self) -> int:
        """Rows in one epoch (all ranks)."""
        return self.source.num_rows

    def start_at(self, global_offset: int) -> None:
        """Begin the next pass at position ``global_offset`` of the epoch's order (examples the whole job
        consumed in this epoch, over all ranks); later passes set it again (usually to 0)."""
        if isinstance(global_offset, bool) or not 0 <= global_offset <= self.num_rows:
            raise ConfigError(f"start position {global_offset!r} is outside the epoch's {self.num_rows} rows")
        self.start_offset = int(global_offset)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass reads (it draws the shuffled order)."""
        self.epoch = epoch

    def num_batches(self) -> int:
        """Batches this rank reads in the next pass (the same on every rank)."""
        cfg = self.config
        return batches_per_rank(
            self.num_rows, cfg.batch_size, self.world_size, self.start_offset, cfg.drop_last
        )

    def order(self) -> RowOrder:
        cfg = self.config
        if not cfg.shuffle:
            return RowOrder(self.num_rows)
        return RowOrder.shuffled(self.num_rows, cfg.seed, self.epoch, cfg.shuffle_block_rows)

    def read(self, order: RowOrder, start: int, stop: int) -> Columns:
        """Positions ``start..stop`` of ``order`` as columns."""
        return concat_columns([self.source.read(a, b) for a, b in order.segments(start, stop)])

    def __iter__(self) -> Iterator[Batch]:
        cfg, shard, order = self.config, worker_shard(self.rank, self.world_size), self.order()
        ranges = rank_ranges(
            self.num_rows, cfg.batch_size, self.world_size, self.rank, self.start_offset, cfg.drop_last
        )
        for index, (start, stop) in enumerate(ranges):
            if shard.owns(index):
                yield columns_to_batch(self.read(order, start, stop), self.feature_names, cfg.label_threshold)
