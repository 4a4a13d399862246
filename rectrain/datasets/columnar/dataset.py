"""``ColumnarDataset``: batches of converted data or users' Parquet, rank-sharded by row ranges.

Batches are the rank's blocks of the global windows of the epoch's rows (``plan``; the windows of the text
sources, ``windows``), so the data position is one number, the same on every rank: a job resumed from it on
any number of ranks reads every remaining row once. Each batch is a few array copies: no per-row Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from torch.utils.data import IterableDataset

from rectrain.datasets.columnar.columns import columns_to_batch, concat_columns
from rectrain.datasets.columnar.converted import ConvertedSource
from rectrain.datasets.columnar.parquet import ParquetSource
from rectrain.datasets.columnar.plan import DEFAULT_SHUFFLE_BLOCK_ROWS, RowOrder, epoch_rows, rank_windows_of
from rectrain.datasets.sharding import check_rank, worker_shard
from rectrain.datasets.windows import BatchAt, Holdout
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
    """The row source of ``config``, checked against its expectations (ConfigError/DataFormatError if not)."""
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
    """This rank's batches of a columnar source in the global windows of ``windows`` (see ``plan``), from
    position ``start_row`` of epoch ``epoch``'s order on, of the rows ``select`` keeps (default: all).

    Use with ``DataLoader(ds, batch_size=None)``: workers take turns by window, so the batches do not depend
    on their number. ``windows()`` also gives each batch's data position.
    """

    def __init__(
        self,
        config: ColumnarConfig,
        rank: int = 0,
        world_size: int = 1,
        *,
        start_row: int = 0,
        select: Holdout | None = None,
        epoch: int = 0,
    ) -> None:
        check_rank(rank, world_size)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.source = open_source(config)
        if isinstance(self.source, ConvertedSource):
            self.feature_names = list(self.source.manifest.sparse_features)
            self.dense_names = list(self.source.manifest.dense_features)
        else:
            self.feature_names, self.dense_names = list(config.sparse_columns), list(config.dense_columns)
        if isinstance(start_row, bool) or not 0 <= start_row <= self.num_rows:
            raise ConfigError(f"start position {start_row!r} is outside the epoch's {self.num_rows} rows")
        self.start_row, self.select, self.epoch = start_row, select, epoch

    @property
    def num_rows(self) -> int:
        """Rows in one epoch (all ranks)."""
        return self.source.num_rows

    def order(self) -> RowOrder:
        cfg = self.config
        if not cfg.shuffle:
            return RowOrder(self.num_rows)
        return RowOrder.shuffled(self.num_rows, cfg.seed, self.epoch, cfg.shuffle_block_rows)

    def windows(self) -> Iterator[BatchAt]:
        """This reader's batch of each window it owns, with the data position after the window."""
        cfg, worker = self.config, worker_shard(self.rank, self.world_size)
        rows = epoch_rows(self.order(), self.select, self.start_row)
        spans = rank_windows_of(rows, cfg.batch_size, self.rank, self.world_size, cfg.drop_last)
        for index, (start, stop, end) in enumerate(spans):
            if worker.owns(index):
                columns = concat_columns([self.source.read(a, b) for a, b in rows.row_ranges(start, stop)])
                yield BatchAt(columns_to_batch(columns, self.feature_names, cfg.label_threshold), end)

    def __iter__(self) -> Iterator[Batch]:
        return (item.batch for item in self.windows())
