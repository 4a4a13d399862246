"""Datasets yielding ready ``Batch``es (TorchRec's ``torchrec.datasets``): synthetic, Criteo TSV, MovieLens.

Each is an ``IterableDataset`` that batches internally, so use ``DataLoader(ds, batch_size=None,
num_workers=N)``; every rank and worker reads its own share (see ``sharding``).
"""

from rectrain.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES, CriteoConfig, CriteoDataset
from rectrain.datasets.factory import DatasetConfig, build_dataset
from rectrain.datasets.movielens import MovieLensConfig, MovieLensDataset
from rectrain.datasets.rows import MalformedRowError, RowStats
from rectrain.datasets.synthetic import SyntheticConfig, SyntheticDataset

__all__ = [
    "DEFAULT_CAT_NAMES",
    "DEFAULT_INT_NAMES",
    "CriteoConfig",
    "CriteoDataset",
    "DatasetConfig",
    "MalformedRowError",
    "MovieLensConfig",
    "MovieLensDataset",
    "RowStats",
    "SyntheticConfig",
    "SyntheticDataset",
    "build_dataset",
]
