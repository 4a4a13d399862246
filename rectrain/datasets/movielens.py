"""MovieLens ratings as an iterable of ready ``Batch``es: features ``user_id`` and ``movie_id``.

Two layouts, chosen by file name: ml-1m's ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``, no header)
and the ``ratings.csv`` of ml-20m / ml-25m / ml-latest (header ``userId,movieId,rating,timestamp``).

  ids     raw id % num_embeddings (MovieLens ids are small positive ints; size the tables above the
          largest id, e.g. 6_041 users / 3_953 movies for ml-1m, and the modulo never folds two ids)
  label   the rating (``task="regression"``) or 1.0 when rating >= ``threshold`` else 0.0 (``"binary"``)
  dense   none: ``dense_features`` is ``[B, 0]``

Bad rows (field count, non-integer ids or timestamp, non-numeric rating) follow the policy of ``rows``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rectrain.datasets.batching import make_batch, one_id_per_example
from rectrain.datasets.lines import TextDataset
from rectrain.datasets.rows import MAX_TABLE_ROWS, RowError, parse_int
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch

FEATURE_NAMES = ["user_id", "movie_id"]
CSV_HEADER = "userId,movieId,rating,timestamp"
_FIELDS = ("user_id", "movie_id", "rating", "timestamp")


@dataclass
class MovieLensConfig:
    """Which ratings files to read and how to label them; ``strict`` raises on the first bad row."""

    paths: list[str]
    batch_size: int = 1024
    num_user_embeddings: int = 200_000
    num_movie_embeddings: int = 300_000
    task: str = "binary"
    threshold: float = 4.0
    drop_last: bool = False
    strict: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):
            raise ConfigError("MovieLensConfig.paths must be a list of file paths, got a single string")
        if not self.paths:
            raise ConfigError("MovieLensConfig.paths is empty; give ratings.dat or ratings.csv files")
        for p in self.paths:
            if _layout(p) is None:
                raise ConfigError(f"MovieLensConfig.paths: {p} is neither a .dat nor a .csv file (or .gz)")
        if self.task not in ("binary", "regression"):
            raise ConfigError(f"MovieLensConfig.task must be 'binary' or 'regression', got {self.task!r}")
        for name in ("batch_size", "num_user_embeddings", "num_movie_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TABLE_ROWS:
                raise ConfigError(f"MovieLensConfig.{name} must be an int in [1, 2**62], got {value!r}")
        if not math.isfinite(self.threshold):
            raise ConfigError(f"MovieLensConfig.threshold must be a finite number, got {self.threshold!r}")


def _layout(path: str) -> str | None:
    suffixes = Path(path).suffixes
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    return {".dat": "dat", ".csv": "csv"}.get(last)


def parse_rating_line(line: str, layout: str) -> tuple[int, int, float] | None:
    """``(user_id, movie_id, rating)`` of one line, ``None`` for the CSV header; ``RowError`` if bad."""
    if layout == "csv" and line.strip() == CSV_HEADER:
        return None
    fields = line.split("::" if layout == "dat" else ",")
    if len(fields) != 4:
        raise RowError("*", f"expected 4 fields (userId, movieId, rating, timestamp), got {len(fields)}")
    user, movie = (_parse_int(fields[i], i) for i in (0, 1))
    _parse_int(fields[3], 3)
    try:
        rating = float(fields[2])
    except ValueError:
        raise RowError(3, f"rating is not a number: {fields[2]!r}") from None
    if not math.isfinite(rating):
        raise RowError(3, f"rating is not finite: {fields[2]!r}")
    return user, movie, rating


def is_rating_header(line: str, path: str) -> bool:
    return _layout(path) == "csv" and line.strip() == CSV_HEADER


def _parse_int(text: str, index: int) -> int:
    return parse_int(text, index + 1, _FIELDS[index], low=0)


class MovieLensDataset(TextDataset[tuple[int, int, float]]):
    """Batches of this rank's and DataLoader worker's share of the ratings (its block of every global window,
    from ``start_row``, of the rows ``select`` keeps; see ``lines.TextDataset``). ``stats`` counts rows read
    and skipped in this process.
    """

    config: MovieLensConfig
    is_header = staticmethod(is_rating_header)

    @staticmethod
    def parse_line(line: str, path: str) -> tuple[int, int, float] | None:
        return parse_rating_line(line, _layout(path))

    def make_batch(self, rows: list[tuple[int, int, float]]) -> Batch:
        cfg = self.config
        users, movies, ratings = (
            (torch.tensor(c) for c in zip(*rows))
            if rows
            else (torch.zeros(0, dtype=torch.int64),) * 2 + (torch.zeros(0),)
        )
        ids = torch.stack([users % cfg.num_user_embeddings, movies % cfg.num_movie_embeddings], dim=1)
        values, lengths = one_id_per_example(FEATURE_NAMES, ids.to(torch.int64))
        labels = ratings.to(torch.float32)
        if cfg.task == "binary":
            labels = (labels >= cfg.threshold).to(torch.float32)
        return make_batch(torch.zeros(len(rows), 0), FEATURE_NAMES, values, lengths, labels)


# TorchRec's column names of ratings.csv and movies.csv (``torchrec.datasets.movielens``).
DEFAULT_RATINGS_COLUMN_NAMES: list[str] = ["userId", "movieId", "rating", "timestamp"]
DEFAULT_MOVIES_COLUMN_NAMES: list[str] = ["movieId", "title", "genres"]
DEFAULT_COLUMN_NAMES: list[str] = DEFAULT_RATINGS_COLUMN_NAMES + DEFAULT_MOVIES_COLUMN_NAMES[1:]

# TorchRec's raw-row readers at this path.
from rectrain.datasets.movielens_rows import movielens_20m, movielens_25m  # noqa: E402, F401
