"""Datasets yielding ready ``Batch``es (TorchRec's ``torchrec.datasets``): synthetic, Criteo TSV, MovieLens;
``write_synthetic_criteo`` makes a learnable Criteo-format file.

Each is an ``IterableDataset`` that batches internally, so use ``DataLoader(ds, batch_size=None,
num_workers=N)``; every rank and worker reads its own share. File sources are read in global windows from a
``DataPosition`` that does not depend on the number of ranks (see ``windows``).
"""

from rectrain.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES, CriteoConfig, CriteoDataset
from rectrain.datasets.criteo_synthetic import SyntheticCriteoSpec, write_synthetic_criteo
from rectrain.datasets.factory import DatasetConfig, build_dataset
from rectrain.datasets.movielens import MovieLensConfig, MovieLensDataset
from rectrain.datasets.rows import MalformedRowError, RowStats
from rectrain.datasets.synthetic import SyntheticConfig, SyntheticDataset
from rectrain.datasets.windows import DataPosition, Holdout

__all__ = [
    "DEFAULT_CAT_NAMES",
    "DEFAULT_INT_NAMES",
    "CriteoConfig",
    "CriteoDataset",
    "DataPosition",
    "DatasetConfig",
    "Holdout",
    "MalformedRowError",
    "MovieLensConfig",
    "MovieLensDataset",
    "RowStats",
    "SyntheticConfig",
    "SyntheticCriteoSpec",
    "SyntheticDataset",
    "build_dataset",
    "write_synthetic_criteo",
]
