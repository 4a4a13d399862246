"""``RandomRecDataset``: random batches of a recommendation model (``torchrec.datasets.random``).

Per batch and feature, in feature order: bag lengths uniform in [min ids, max ids], then ids uniform in
[0, hash size); then dense features ~ N(0, 1) and 0/1 labels. With ``manual_seed`` the draws come from a
generator of that seed, in that order, so a seed gives the same batches as TorchRec's dataset. The first
``num_generated_batches`` batches are made once and cycled (a negative count draws every batch anew).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

from rectrain.models.batch import Batch
from rectrain.sparse import KeyedJaggedTensor


def _per_key(
    values: list[int] | None, value: int | None, default: int, keys: list[str], name: str
) -> list[int]:
    result = values if values is not None else [value if value else default] * len(keys)
    if len(result) != len(keys):
        raise ValueError(f"{name} has {len(result)} entries for {len(keys)} keys")
    return list(result)


class _Batches:
    """The cycling batch iterator behind ``RandomRecDataset``."""

    def __init__(
        self,
        keys: list[str],
        batch_size: int,
        hash_sizes: list[int],
        ids: tuple[list[int], list[int]],
        num_dense: int,
        manual_seed: int | None,
        num_generated_batches: int,
    ) -> None:
        self.keys, self.batch_size, self.hash_sizes = keys, batch_size, hash_sizes
        self.min_ids, self.max_ids = ids
        self.num_dense, self.num_generated_batches = num_dense, num_generated_batches
        self.generator = torch.Generator().manual_seed(manual_seed) if manual_seed is not None else None
        self._cached = [self._draw() for _ in range(max(num_generated_batches, 0))]
        self._index = 0

    def __iter__(self) -> _Batches:
        self._index = 0
        return self

    def __next__(self) -> Batch:
        batch = self._cached[self._index % len(self._cached)] if self._cached else self._draw()
        self._index += 1
        return batch

    def _draw(self) -> Batch:
        lengths, values = [], []
        for rows, low, high in zip(self.hash_sizes, self.min_ids, self.max_ids):
            length = torch.randint(
                low, high + 1, (self.batch_size,), dtype=torch.int32, generator=self.generator
            )
            lengths.append(length)
            values.append(torch.randint(0, rows, (int(length.sum()),), generator=self.generator))
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=self.keys, values=torch.cat(values), lengths=torch.cat(lengths)
        )
        dense = torch.randn(self.batch_size, self.num_dense, generator=self.generator)
        labels = torch.randint(0, 2, (self.batch_size,), generator=self.generator)
        return Batch(dense_features=dense, sparse_features=sparse, labels=labels)


class RandomRecDataset(IterableDataset):
    """Random ``Batch``es of ``keys`` (TorchRec's arguments; see the module doc).

    Args:
        keys: sparse feature names.
        batch_size: examples per batch.
        hash_size / hash_sizes: ids lie in [0, size) (per key; default 100).
        ids_per_feature / ids_per_features: the most ids per example and feature (default 2).
        num_dense: dense features per example.
        manual_seed: seed of the draws (None: torch's default generator).
        num_batches: batches before the iterator stops (None: endless).
        num_generated_batches: batches made once and cycled; negative: draw every batch.
        min_ids_per_feature / min_ids_per_features: the fewest ids (default: ``ids_per_feature``, else 0).
    """

    def __init__(
        self,
        keys: list[str],
        batch_size: int,
        hash_size: int | None = None,
        hash_sizes: list[int] | None = None,
        ids_per_feature: int | None = None,
        ids_per_features: list[int] | None = None,
        num_dense: int = 50,
        manual_seed: int | None = None,
        num_batches: int | None = None,
        num_generated_batches: int = 10,
        min_ids_per_feature: int | None = None,
        min_ids_per_features: list[int] | None = None,
    ) -> None:
        super().__init__()
        keys = list(keys)
        hash_sizes = _per_key(hash_sizes, hash_size, 100, keys, "hash_sizes")
        max_ids = _per_key(ids_per_features, ids_per_feature, 2, keys, "ids_per_features")
        least = min_ids_per_feature if min_ids_per_feature is not None else ids_per_feature
        min_ids = _per_key(min_ids_per_features, least, 0, keys, "min_ids_per_features")
        self.batch_generator = _Batches(
            keys, batch_size, hash_sizes, (min_ids, max_ids), num_dense, manual_seed, num_generated_batches
        )
        self.num_batches = num_batches if num_batches is not None else sys.maxsize

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self.batch_generator), self.num_batches)

    def __len__(self) -> int:
        return self.num_batches
