"""``rectrain data convert``: Criteo TSV or MovieLens ratings into converted data (``columnar``), once.

The text is parsed and hashed exactly as the training readers do (Criteo with the vectorised parser,
MovieLens with its line parser), malformed rows are reported as they report them (file:line warnings and a
count, or the first one raised with ``strict``), and the rows are written in file order into part files of
``rows_per_part`` rows, with a manifest recording the table sizes the ids were hashed into.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rectrain.datasets.columnar.manifest import ColumnarManifest
from rectrain.datasets.columnar.writer import (
    DEFAULT_ROWS_PER_PART,
    ColumnarWriter,
    id_dtype_for,
    prepare_output_dir,
)
from rectrain.datasets.criteo import DEFAULT_INT_NAMES, CriteoConfig, parse_criteo_line
from rectrain.datasets.criteo_columns import iter_criteo_columns
from rectrain.datasets.lines import RowParser, numbered_lines
from rectrain.datasets.movielens import FEATURE_NAMES as MOVIELENS_FEATURES
from rectrain.datasets.movielens import MovieLensConfig, MovieLensDataset, is_rating_header
from rectrain.datasets.rows import DataFileError, RowStats
from rectrain.datasets.sniff import sniff_text_file

logger = logging.getLogger(__name__)

_MOVIELENS_CHUNK = 1 << 16
Rows = tuple[np.ndarray, np.ndarray, np.ndarray]  # labels [n], dense [n, D], ids [n, K]


@dataclass
class ConvertResult:
    """What a conversion wrote and how long it took."""

    manifest: ColumnarManifest
    directory: Path
    seconds: float
    input_bytes: int

    @property
    def rows_per_s(self) -> float:
        return self.manifest.num_rows / self.seconds if self.seconds > 0 else 0.0


def _criteo_rows(config: CriteoConfig, stats: RowStats) -> Iterator[Rows]:
    rows = config.table_rows()
    for path in config.paths:
        for block in iter_criteo_columns(path, rows, stats, strict=config.strict):
            yield block.labels, block.dense, block.ids


def _movielens_rows(config: MovieLensConfig, stats: RowStats) -> Iterator[Rows]:
    starts: list[tuple[int, int]] = []
    parse = RowParser(config.paths, starts, MovieLensDataset.parse_line, stats, strict=config.strict)
    lines = numbered_lines(config.paths, starts, is_rating_header)
    parsed = (row for index, text in lines if (row := parse(index, text)) is not None)
    while chunk := list(itertools.islice(parsed, _MOVIELENS_CHUNK)):
        users, movies, ratings = zip(*chunk)
        ids = np.stack(  # parsed ids are in [0, 2**63): int64 holds them
            [
                np.array(users, dtype=np.int64) % config.num_user_embeddings,
                np.array(movies, dtype=np.int64) % config.num_movie_embeddings,
            ],
            axis=1,
        )
        yield np.array(ratings, dtype=np.float32), np.zeros((len(chunk), 0), np.float32), ids


def _template(config: CriteoConfig | MovieLensConfig) -> ColumnarManifest:
    if isinstance(config, CriteoConfig):
        rows = config.table_rows()
        return ColumnarManifest(
            kind="criteo",
            label="click",
            dense_features=list(DEFAULT_INT_NAMES),
            sparse_features=list(config.cat_feature_names),
            table_rows=rows,
            id_dtype=str(id_dtype_for(rows)),
            transforms={
                "dense": "float32(log1p(max(x, 0))); empty -> 0",
                "sparse": "1 + int(hex, 16) % (rows - 1); empty -> 0",
            },
        )
    rows = [config.num_user_embeddings, config.num_movie_embeddings]
    return ColumnarManifest(
        kind="movielens",
        label="rating",
        dense_features=[],
        sparse_features=list(MOVIELENS_FEATURES),
        table_rows=rows,
        id_dtype=str(id_dtype_for(rows)),
        transforms={"sparse": "id % rows", "label": "the rating; binary tasks compare it with a threshold"},
    )


def _line_parser(config: CriteoConfig | MovieLensConfig) -> tuple[Callable[[str, str], object], str]:
    """The source's line parser (for ``sniff``) and what its rows are called."""
    if isinstance(config, CriteoConfig):
        rows = config.table_rows()
        return (lambda line, path: parse_criteo_line(line, rows)), "Criteo TSV"
    return MovieLensDataset.parse_line, "MovieLens ratings"


def convert(
    config: CriteoConfig | MovieLensConfig,
    directory: str | Path,
    *,
    rows_per_part: int = DEFAULT_ROWS_PER_PART,
    overwrite: bool = False,
    on_rows: Callable[[int], None] | None = None,
) -> ConvertResult:
    """Convert ``config.paths`` into ``directory``; ``on_rows(n)`` is told of every block written."""
    directory = Path(directory)
    parse, kind = _line_parser(config)
    for path in config.paths:
        sniff_text_file(path, "input file", parse, kind)
    prepare_output_dir(directory, overwrite)
    start = time.perf_counter()
    stats = RowStats()
    writer = ColumnarWriter(directory, _template(config), rows_per_part)
    blocks = (
        _criteo_rows(config, stats) if isinstance(config, CriteoConfig) else _movielens_rows(config, stats)
    )
    for labels, dense, ids in blocks:
        writer.append(labels, dense, ids)
        if on_rows is not None:
            on_rows(len(labels))
    if not stats.rows_read:  # no manifest: the directory is not converted data
        raise DataFileError(
            f"no rows to convert: all {stats.rows_skipped:,} lines of {', '.join(map(str, config.paths))} "
            f"are malformed (see the warnings); give {kind} files"
        )
    manifest = writer.finish(
        source={
            "paths": [str(Path(p).resolve()) for p in config.paths],
            "rows_read": stats.rows_read,
            "rows_skipped": stats.rows_skipped,
            "skipped_by_column": {str(k): v for k, v in stats.skipped_by_column.items()},
        }
    )
    seconds = time.perf_counter() - start
    input_bytes = sum(Path(p).stat().st_size for p in config.paths)
    logger.info(
        "converted %d rows (%d skipped) into %s in %.1f s",
        manifest.num_rows,
        stats.rows_skipped,
        directory,
        seconds,
    )
    return ConvertResult(manifest, directory, seconds, input_bytes)
