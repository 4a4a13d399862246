"""Where training data enters: files and generators read, checked and batched (as ``torchrec.datasets``).

Synthetic, Criteo TSV, MovieLens, converted columnar data and Parquet (``ColumnarDataset``), each yielding
ready ``Batch``es; ``write_synthetic_criteo`` makes a learnable Criteo-format file and ``convert`` turns text
into columnar data (``rectrain data convert``).

Each is an ``IterableDataset`` that batches internally, so use ``DataLoader(ds, batch_size=None,
num_workers=N)``; every rank and worker reads its own share. File sources are read in global windows from a
``DataPosition`` that does not depend on the number of ranks (see ``windows``).
"""

from rectrain.datasets.columnar import ColumnarConfig, ColumnarDataset
from rectrain.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES, CriteoConfig, CriteoDataset
from rectrain.datasets.criteo_synthetic import (
    SyntheticCriteoSpec,
    synthetic_criteo_token,
    write_synthetic_criteo,
)
from rectrain.datasets.factory import DatasetConfig, build_dataset
from rectrain.datasets.movielens import MovieLensConfig, MovieLensDataset
from rectrain.datasets.rows import MalformedRowError, RowStats
from rectrain.datasets.synthetic import SyntheticConfig, SyntheticDataset
from rectrain.datasets.windows import DataPosition, Holdout

__all__ = [
    "ColumnarConfig",
    "ColumnarDataset",
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
    "synthetic_criteo_token",
    "write_synthetic_criteo",
]
