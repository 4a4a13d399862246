"""Criteo TSV files as a stream of rows (``torchrec.datasets.criteo``'s ``criteo_terabyte`` /
``criteo_kaggle``).

Each row is split on tabs and handed to a ``row_mapper``; the default maps it to ``{"label": int,
"int_0".."int_12": int, "cat_0".."cat_25": hex str}``, aligning the columns from the end, so a test file
(no label column) maps to the same feature names without ``"label"``. Unparsable or empty numbers become 0,
empty categories "". With a ``DataLoader`` of several workers, files are dealt to workers in turn, so each
row is read once.

This is TorchRec's raw-row interface; rectrain's own training reader is ``rectrain.datasets.criteo``.
"""

import csv
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from rectrain.datasets.npy_files import open_file
from rectrain.datasets.utils import safe_cast

INT_FEATURE_COUNT = 13
CAT_FEATURE_COUNT = 26
DAYS = 24
FREQUENCY_THRESHOLD = 3
TOTAL_TRAINING_SAMPLES = 4195197692  # rows of days 0-22 of Criteo 1TB (day 23: validation and test)
DEFAULT_LABEL_NAME = "label"
DEFAULT_INT_NAMES: list[str] = [f"int_{i}" for i in range(INT_FEATURE_COUNT)]
DEFAULT_CAT_NAMES: list[str] = [f"cat_{i}" for i in range(CAT_FEATURE_COUNT)]
DEFAULT_COLUMN_NAMES: list[str] = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]

RowMapper = Callable[[list[str]], Any]


def _cast(name: str, value: str) -> int | str:
    return safe_cast(value, str, "") if name.startswith("cat_") else safe_cast(value, int, 0)


def _default_row_mapper(example: list[str]) -> dict[str, int | str]:
    """Columns named from the end: label (if present), 13 ints, 26 categories."""
    if len(example) > len(DEFAULT_COLUMN_NAMES):
        raise ValueError(f"a Criteo row has at most {len(DEFAULT_COLUMN_NAMES)} columns, got {len(example)}")
    names = DEFAULT_COLUMN_NAMES[len(DEFAULT_COLUMN_NAMES) - len(example) :]
    return {name: _cast(name, value) for name, value in zip(names, example)}


class CriteoIterDataPipe(IterableDataset):
    """The rows of Criteo TSV ``paths``, mapped by ``row_mapper`` (None: the split line as is).

    Args:
        paths: the TSV files (local; ``open_kw`` go to ``open``).
        row_mapper: applied to each split line.
    """

    def __init__(
        self, paths: Iterable[str], *, row_mapper: RowMapper | None = _default_row_mapper, **open_kw: Any
    ):
        self.paths = paths
        self.row_mapper = row_mapper
        self.open_kw: Any = open_kw

    def _my_paths(self) -> list[str]:
        paths = list(self.paths)
        worker = torch.utils.data.get_worker_info()
        if worker is None:
            return paths
        return [path for i, path in enumerate(paths) if i % worker.num_workers == worker.id]

    def __iter__(self) -> Iterator[Any]:
        for path in self._my_paths():
            with open_file(path, "r", **self.open_kw) as lines:
                for row in csv.reader(lines, delimiter="\t"):
                    yield self.row_mapper(row) if self.row_mapper else row


def criteo_terabyte(
    paths: Iterable[str], *, row_mapper: RowMapper | None = _default_row_mapper, **open_kw: Any
) -> CriteoIterDataPipe:
    """The rows of Criteo 1TB Click Logs day files (``day_0`` ... ``day_23``)."""
    return CriteoIterDataPipe(paths, row_mapper=row_mapper, **open_kw)


def criteo_kaggle(
    path: str, *, row_mapper: RowMapper | None = _default_row_mapper, **open_kw: Any
) -> CriteoIterDataPipe:
    """The rows of the Kaggle Display Advertising ``train.txt`` or ``test.txt`` (no labels)."""
    return CriteoIterDataPipe((path,), row_mapper=row_mapper, **open_kw)
