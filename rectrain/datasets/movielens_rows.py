"""MovieLens 20M / 25M ``ratings.csv`` as a stream of rows (``torchrec.datasets.movielens``' readers).

Each rating line (header skipped) is split on commas, optionally extended with its movie's ``title`` and
``genres`` from ``movies.csv`` (read once, CSV-quoted titles kept whole), and handed to ``row_mapper``; the
default gives ``{"userId": int, "movieId": int, "rating": float, "timestamp": int[, "title", "genres"]}``
(unparsable numbers become 0). rectrain's own batch reader is ``rectrain.datasets.movielens``.
"""

import csv
import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from rectrain.datasets.npy_files import open_file
from rectrain.datasets.utils import safe_cast

RATINGS_FILENAME = "ratings.csv"
MOVIES_FILENAME = "movies.csv"
_COLUMNS: list[tuple[str, type, Any]] = [
    ("userId", int, 0),
    ("movieId", int, 0),
    ("rating", float, 0.0),
    ("timestamp", int, 0),
    ("title", str, ""),
    ("genres", str, ""),
]

RowMapper = Callable[[list[str]], Any]


def _default_row_mapper(example: list[str]) -> dict[str, float | int | str]:
    return {name: safe_cast(value, kind, default) for (name, kind, default), value in zip(_COLUMNS, example)}


def _csv_rows(path: str, **open_kw: Any) -> Iterator[list[str]]:
    """The rows of a CSV file after its header line."""
    with open_file(path, "r", **open_kw) as lines:
        rows = csv.reader(lines, delimiter=",")
        next(rows, None)
        yield from rows


class MovieLensRows(IterableDataset):
    """The ratings of a MovieLens root folder, mapped by ``row_mapper`` (None: the split line)."""

    def __init__(
        self,
        root: str,
        include_movies_data: bool = False,
        row_mapper: RowMapper | None = _default_row_mapper,
        **open_kw: Any,
    ) -> None:
        self.root, self.include_movies_data, self.row_mapper, self.open_kw = (
            root,
            include_movies_data,
            row_mapper,
            open_kw,
        )

    def __iter__(self) -> Iterator[Any]:
        movies: dict[str, list[str]] = {}
        if self.include_movies_data:
            movies = {row[0]: row[1:] for row in _csv_rows(os.path.join(self.root, MOVIES_FILENAME))}
        for row in _csv_rows(os.path.join(self.root, RATINGS_FILENAME), **self.open_kw):
            if self.include_movies_data:
                row = row + movies[row[1]]
            yield self.row_mapper(row) if self.row_mapper else row


def movielens_20m(
    root: str,
    *,
    include_movies_data: bool = False,
    row_mapper: RowMapper | None = _default_row_mapper,
    **open_kw: Any,
) -> MovieLensRows:
    """`MovieLens 20M <https://grouplens.org/datasets/movielens/20m/>`_ ratings under ``root``."""
    return MovieLensRows(root, include_movies_data, row_mapper, **open_kw)


def movielens_25m(
    root: str,
    *,
    include_movies_data: bool = False,
    row_mapper: RowMapper | None = _default_row_mapper,
    **open_kw: Any,
) -> MovieLensRows:
    """`MovieLens 25M <https://grouplens.org/datasets/movielens/25m/>`_ ratings under ``root``."""
    return MovieLensRows(root, include_movies_data, row_mapper, **open_kw)
