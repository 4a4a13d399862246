"""``InMemoryBinaryCriteoIterDataPipe``: batches of Criteo ``.npy`` day files held in memory (TorchRec's, at
its path, with its batch order, so a seed and a world size give the same batches on each rank).

Rows of all files, in file order, are cut into batches of ``batch_size``; batch ``i`` belongs to rank
``i % world_size``. The last round (unless ``drop_last``) splits the remaining rows over the ranks, so every
rank yields the same number of batches and every row is read once. ``stage="val"`` / ``"test"`` keep the
first / second half of the first file (Criteo's last day). ``shuffle_training_set`` instead permutes all
training rows (NumPy's RNG seeded with ``shuffle_training_set_random_seed``) and gives each rank a contiguous
run of the permutation, cut into local batches.

Each batch is a ``Batch``: dense ``[B, 13]``, a KeyedJaggedTensor ``cat_0..cat_25`` with one id per example
(modulo ``hashes``, per feature), labels ``[B]``.
"""

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset

from rectrain.datasets.criteo_tsv import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES
from rectrain.datasets.npy_files import PATH_MANAGER_KEY, check_path_manager
from rectrain.models.batch import Batch
from rectrain.sparse import KeyedJaggedTensor


def _batch_sizes(
    total_rows: int, batch_size: int, world_size: int, drop_last: bool
) -> tuple[int, np.ndarray]:
    """(full batches over all ranks, a multiple of world_size; each rank's last batch size, 0 if none)."""
    full = total_rows // batch_size // world_size * world_size
    last = np.zeros(world_size, dtype=np.int64)
    remainder = total_rows % (world_size * batch_size)
    if not drop_last and remainder > 0:
        if remainder < world_size:
            # Too few rows for a last round: the last full round absorbs them (some batches one row larger).
            full -= world_size
            last += batch_size
        else:
            last += remainder // world_size
        last[: remainder % world_size] += 1
    return full, last


class InMemoryBinaryCriteoIterDataPipe(IterableDataset):
    """Batches of this rank from Criteo ``.npy`` files (see the module doc).

    Args (TorchRec's): stage ("train", "val", "test"), dense_paths, sparse_paths, labels_paths (one of each
    per day file), batch_size, rank, world_size, drop_last, shuffle_batches (permute rows within each batch),
    shuffle_training_set, shuffle_training_set_random_seed (seeds NumPy's global RNG, as TorchRec), mmap_mode
    (memory-map the files instead of reading them), hashes (per-feature table sizes; ids are taken modulo),
    path_manager_key.
    """

    def __init__(
        self,
        stage: str,
        dense_paths: list[str],
        sparse_paths: list[str],
        labels_paths: list[str],
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool | None = False,
        shuffle_batches: bool = False,
        shuffle_training_set: bool = False,
        shuffle_training_set_random_seed: int = 0,
        mmap_mode: bool = False,
        hashes: list[int] | None = None,
        path_manager_key: str = PATH_MANAGER_KEY,
    ) -> None:
        check_path_manager(path_manager_key)
        self.stage, self.batch_size = stage, batch_size
        self.dense_paths, self.sparse_paths, self.labels_paths = dense_paths, sparse_paths, labels_paths
        self.rank, self.world_size = rank, world_size
        self.drop_last, self.shuffle_batches, self.mmap_mode = drop_last, shuffle_batches, mmap_mode
        self.shuffle_training_set = shuffle_training_set
        np.random.seed(shuffle_training_set_random_seed)
        self.hashes = None if hashes is None else np.array(hashes).reshape((1, CAT_FEATURE_COUNT))
        self.path_manager_key = path_manager_key
        if shuffle_training_set and stage == "train":
            self._shuffle_and_load_data_for_rank()
            self.rank, self.world_size = 0, 1  # this rank's rows are already its own
        else:
            mode = "r" if mmap_mode else None
            self.dense_arrs = [np.load(f, mmap_mode=mode) for f in dense_paths]
            self.sparse_arrs = [np.load(f, mmap_mode=mode) for f in sparse_paths]
            self.labels_arrs = [np.load(f, mmap_mode=mode) for f in labels_paths]
        self._split_first_file(stage)
        if not mmap_mode and self.hashes is not None:
            for sparse in self.sparse_arrs:
                sparse %= self.hashes
        self.num_rows_per_file: list[int] = [len(a) for a in self.dense_arrs]
        self.num_full_batches, self.last_batch_sizes = _batch_sizes(
            sum(self.num_rows_per_file), batch_size, self.world_size, bool(drop_last)
        )
        self.keys: list[str] = DEFAULT_CAT_NAMES

    def _split_first_file(self, stage: str) -> None:
        """val: the first half of the first file (the larger half when odd); test: the rest."""
        rows = len(self.dense_arrs[0])
        half = rows // 2 + rows % 2
        if stage in ("val", "test"):
            part = slice(0, half) if stage == "val" else slice(half, rows)
            for arrays in (self.dense_arrs, self.sparse_arrs, self.labels_arrs):
                arrays[0] = arrays[0][part, :]

    def _shuffle_and_load_data_for_rank(self) -> None:
        dense = [np.load(f, mmap_mode="r") for f in self.dense_paths]
        sparse = [np.load(f, mmap_mode="r") for f in self.sparse_paths]
        labels = [np.load(f, mmap_mode="r") for f in self.labels_paths]
        starts = np.cumsum([0] + [len(a) for a in dense])
        total = int(starts[-1])
        permutation = np.random.permutation(total)  # row i goes to position permutation[i]
        self.remainder = total % self.world_size
        per_rank = np.full(self.world_size, total // self.world_size)
        per_rank[: self.remainder] += 1
        first = int(np.sum(per_rank[: self.rank]))
        # The rows whose positions fall in this rank's run, in position order.
        rows = np.argsort(permutation, kind="stable")[first : first + per_rank[self.rank]]
        files = np.searchsorted(starts, rows, side="right") - 1
        self.dense_arrs = [_gather(dense, files, rows - starts[files])]
        self.sparse_arrs = [_gather(sparse, files, rows - starts[files])]
        self.labels_arrs = [_gather(labels, files, rows - starts[files])]

    def _rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``[start, stop)`` of the files read back to back."""
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        first = 0
        for index, count in enumerate(self.num_rows_per_file):
            lo, hi = max(start - first, 0), min(stop - first, count)
            if lo < hi:
                sparse = self.sparse_arrs[index][lo:hi, :]
                if self.mmap_mode and self.hashes is not None:
                    sparse = sparse % self.hashes
                parts.append((self.dense_arrs[index][lo:hi, :], sparse, self.labels_arrs[index][lo:hi, :]))
            first += count
        dense, sparse, labels = zip(*parts)
        return tuple(np.concatenate(p) if len(p) > 1 else p[0] for p in (dense, sparse, labels))

    def _np_arrays_to_batch(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
        if self.shuffle_batches:
            order = np.random.permutation(len(dense))
            dense, sparse, labels = dense[order], sparse[order], labels[order]
        size = len(dense)
        ids = CAT_FEATURE_COUNT * size
        return Batch(
            dense_features=torch.from_numpy(np.ascontiguousarray(dense)),
            sparse_features=KeyedJaggedTensor(
                keys=self.keys,
                values=torch.from_numpy(np.ascontiguousarray(sparse.transpose(1, 0)).reshape(-1)),
                lengths=torch.ones(ids, dtype=torch.int32),
                offsets=torch.arange(0, ids + 1, dtype=torch.int32),
                stride=size,
                length_per_key=[size] * CAT_FEATURE_COUNT,
                offset_per_key=[size * i for i in range(CAT_FEATURE_COUNT + 1)],
                index_per_key={key: i for i, key in enumerate(self.keys)},
            ),
            labels=torch.from_numpy(np.ascontiguousarray(labels).reshape(-1)),
        )

    def _global_batch_sizes(self) -> list[int]:
        last_round = [int(s) for s in self.last_batch_sizes] if self.last_batch_sizes[0] > 0 else []
        return [self.batch_size] * self.num_full_batches + last_round

    def __iter__(self) -> Iterator[Batch]:
        start = 0
        for index, size in enumerate(self._global_batch_sizes()):
            if index % self.world_size == self.rank:
                yield self._np_arrays_to_batch(*self._rows(start, start + size))
            start += size

    def __len__(self) -> int:
        return self.num_full_batches // self.world_size + int(self.last_batch_sizes[0] > 0)


def _gather(arrays: list[np.ndarray], files: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``arrays[files[i]][rows[i]]`` for each i, as one array."""
    out = np.empty((len(rows), arrays[0].shape[1]), dtype=arrays[0].dtype)
    for index, array in enumerate(arrays):
        mine = files == index
        out[mine] = array[rows[mine]]
    return out
