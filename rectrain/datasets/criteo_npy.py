"""``BinaryCriteoUtils``: TorchRec's preprocessing of Criteo into ``.npy`` files, at its path and with its
file layout, so the files users already made with TorchRec's scripts load here and new ones match them.

Per day ``day_<d>_dense.npy`` (float32 ``[rows, 13]``: ``log(x - min + 2)`` over the file's integers),
``day_<d>_sparse.npy`` (the categories' hex values, int64 ``[rows, 26]``; after ``sparse_to_contiguous``,
small ids per column) and ``day_<d>_labels.npy`` (int32 ``[rows, 1]``).
"""

import os
import shutil

import numpy as np

from rectrain.datasets.criteo_tsv import (
    CAT_FEATURE_COUNT,
    DAYS,
    FREQUENCY_THRESHOLD,
    INT_FEATURE_COUNT,
    CriteoIterDataPipe,
)
from rectrain.datasets.npy_files import PATH_MANAGER_KEY, get_shape_from_npy, load_npy_range, save_npy


def _row_mapper(has_label: bool):
    """(dense ints, sparse ints, label) of a split TSV line; -1 for the label of an unlabelled file."""
    first = 1 if has_label else 0

    def mapper(row: list[str]) -> tuple[list[int], list[int], int]:
        dense = [int(row[i] or "0") for i in range(first, first + INT_FEATURE_COUNT)]
        sparse_end = first + INT_FEATURE_COUNT + CAT_FEATURE_COUNT
        sparse = [int(row[i] or "0", 16) for i in range(first + INT_FEATURE_COUNT, sparse_end)]
        return dense, sparse, int(row[0] or "0") if has_label else -1

    return mapper


def _contiguous_column(values: np.ndarray, frequency_threshold: int) -> np.ndarray:
    """Each value's id: 2, 3, ... in order of first appearance; 1 for values seen fewer than
    ``frequency_threshold`` times (when it is above 1)."""
    uniques, first_seen, inverse, counts = np.unique(
        values, return_index=True, return_inverse=True, return_counts=True
    )
    frequent = counts >= frequency_threshold if frequency_threshold > 1 else np.ones(len(uniques), dtype=bool)
    by_appearance = np.argsort(first_seen, kind="stable")
    ids = np.ones(len(uniques), dtype=np.int64)
    ranked = by_appearance[frequent[by_appearance]]
    ids[ranked] = np.arange(2, 2 + len(ranked))
    return ids[inverse.reshape(-1)]


class BinaryCriteoUtils:
    """Convert, inspect, split, renumber and shuffle Criteo ``.npy`` files (all static methods)."""

    get_shape_from_npy = staticmethod(get_shape_from_npy)
    load_npy_range = staticmethod(load_npy_range)

    @staticmethod
    def tsv_to_npys(
        in_file: str,
        out_dense_file: str,
        out_sparse_file: str,
        out_labels_file: str,
        dataset_name: str = "criteo_1tb",
        path_manager_key: str = PATH_MANAGER_KEY,
    ) -> None:
        """One TSV day file to its dense, sparse and labels ``.npy`` files (a Kaggle test file, whose name
        contains "test", has no label column: its labels are -1)."""
        has_label = not (dataset_name == "criteo_kaggle" and "test" in in_file)
        dense, sparse, labels = [], [], []
        for row_dense, row_sparse, label in CriteoIterDataPipe([in_file], row_mapper=_row_mapper(has_label)):
            dense.append(row_dense)
            sparse.append(row_sparse)
            labels.append(label)
        dense_np = np.array(dense, dtype=np.int32)
        dense_np -= dense_np.min() - 2  # so the smallest value becomes 2 and its log positive
        save_npy(out_dense_file, np.log(dense_np, dtype=np.float32), path_manager_key)
        save_npy(out_sparse_file, np.array(sparse, dtype=np.int64), path_manager_key)
        save_npy(out_labels_file, np.array(labels, dtype=np.int32).reshape((-1, 1)), path_manager_key)

    @staticmethod
    def get_file_row_ranges_and_remainder(
        lengths: list[int], rank: int, world_size: int, start_row: int = 0, last_row: int | None = None
    ) -> tuple[dict[int, tuple[int, int]], int]:
        """Which rows of which files ``rank`` reads: ``({file index: (first, last) row, inclusive},
        rows % world_size)``. Rows ``start_row..last_row`` (default: to the end) are dealt out in contiguous
        runs, the first ``remainder`` ranks one row more."""
        total = sum(lengths) - start_row if last_row is None else last_row - start_row + 1
        base, remainder = divmod(total, world_size)
        first = start_row + rank * base + min(rank, remainder)
        last = first + base + (1 if rank < remainder else 0) - 1
        ranges, file_first = {}, 0
        for index, length in enumerate(lengths):
            file_last = file_first + length - 1
            if first <= file_last and last >= file_first:
                ranges[index] = (max(first, file_first) - file_first, min(last, file_last) - file_first)
            file_first = file_last + 1
        return ranges, remainder

    @staticmethod
    def sparse_to_contiguous(
        in_files: list[str],
        output_dir: str,
        frequency_threshold: int = FREQUENCY_THRESHOLD,
        columns: int = CAT_FEATURE_COUNT,
        path_manager_key: str = PATH_MANAGER_KEY,
        output_file_suffix: str = "_contig_freq.npy",
    ) -> None:
        """Renumber each sparse column over all files together: ids 2, 3, ... in order of first appearance
        (files in the given order), 1 for values seen fewer than ``frequency_threshold`` times. Writes
        ``<output_dir>/<input name><output_file_suffix>`` per file, same dtype."""
        arrays = {os.path.basename(f).split(".")[0]: np.load(f) for f in in_files}
        rows = [len(a) for a in arrays.values()]
        for column in range(columns):
            joined = np.concatenate([a[:, column] for a in arrays.values()])
            renumbered = _contiguous_column(joined, frequency_threshold)
            for array, part in zip(arrays.values(), np.split(renumbered, np.cumsum(rows)[:-1])):
                array[:, column] = part
        for name, array in arrays.items():
            save_npy(os.path.join(output_dir, name + output_file_suffix), array, path_manager_key)

    @staticmethod
    def shuffle(
        input_dir_labels_and_dense: str,
        input_dir_sparse: str,
        output_dir_shuffled: str,
        rows_per_day: dict[int, int],
        output_dir_full_set: str | None = None,
        days: int = DAYS,
        int_columns: int = INT_FEATURE_COUNT,
        sparse_columns: int = CAT_FEATURE_COUNT,
        path_manager_key: str = PATH_MANAGER_KEY,
        random_seed: int = 0,
    ) -> None:
        """Shuffle the rows of days ``0..days-2`` together (NumPy's RNG seeded with ``random_seed``) and
        write them back as day files of the same sizes; the last day (validation/test) is copied unchanged.
        ``output_dir_full_set``: also save the unshuffled ``full.npy`` there (``[dense|sparse|label]``)."""
        full = _stack_days(
            input_dir_labels_and_dense, input_dir_sparse, rows_per_day, days, int_columns, sparse_columns
        )
        if output_dir_full_set is not None:
            save_npy(os.path.join(output_dir_full_set, "full.npy"), full, path_manager_key)
        np.random.seed(random_seed)
        np.random.shuffle(full)
        first = 0
        for day in range(days - 1):
            part = full[first : first + rows_per_day[day]]
            out = os.path.join(output_dir_shuffled, f"day_{day}_{{}}.npy")
            save_npy(out.format("dense"), part[:, :int_columns], path_manager_key)
            save_npy(out.format("sparse"), part[:, int_columns:-1].astype(np.int32), path_manager_key)
            save_npy(out.format("labels"), part[:, -1:].astype(np.int32), path_manager_key)
            first += rows_per_day[day]
        for kind, folder in (
            ("sparse", input_dir_sparse),
            ("dense", input_dir_labels_and_dense),
            ("labels", input_dir_labels_and_dense),
        ):
            name = f"day_{days - 1}_{kind}.npy"
            shutil.copyfile(os.path.join(folder, name), os.path.join(output_dir_shuffled, name))


def _stack_days(
    dense_dir: str,
    sparse_dir: str,
    rows_per_day: dict[int, int],
    days: int,
    int_columns: int,
    sparse_columns: int,
) -> np.ndarray:
    """Days ``0..days-2`` as one float32 ``[rows, dense | sparse | label]`` array."""
    full = np.zeros((sum(rows_per_day.values()), int_columns + sparse_columns + 1), dtype=np.float32)
    first = 0
    for day in range(days - 1):
        rows = slice(first, first + rows_per_day[day])
        full[rows, :int_columns] = np.load(os.path.join(dense_dir, f"day_{day}_dense.npy"))
        full[rows, int_columns:-1] = np.load(os.path.join(sparse_dir, f"day_{day}_sparse.npy"))
        full[rows, -1:] = np.load(os.path.join(dense_dir, f"day_{day}_labels.npy"))
        first += rows_per_day[day]
    return full
