"""``build_dataset``: the one place that maps a source's config to its dataset class."""

from __future__ import annotations

from torch.utils.data import IterableDataset

from rectrain.datasets.columnar import ColumnarConfig, ColumnarDataset
from rectrain.datasets.criteo import CriteoConfig, CriteoDataset
from rectrain.datasets.movielens import MovieLensConfig, MovieLensDataset
from rectrain.datasets.synthetic import SyntheticConfig, SyntheticDataset
from rectrain.errors import ConfigError

DatasetConfig = SyntheticConfig | CriteoConfig | MovieLensConfig | ColumnarConfig


def build_dataset(config: DatasetConfig, rank: int = 0, world_size: int = 1) -> IterableDataset:
    """The dataset of ``config`` for ``rank`` of ``world_size``; use it with ``DataLoader(batch_size=None)``.

    Raises ``ConfigError`` for a config type it does not know.
    """
    if isinstance(config, SyntheticConfig):
        return SyntheticDataset(config, rank, world_size)
    if isinstance(config, CriteoConfig):
        return CriteoDataset(config, rank, world_size)
    if isinstance(config, MovieLensConfig):
        return MovieLensDataset(config, rank, world_size)
    if isinstance(config, ColumnarConfig):
        return ColumnarDataset(config, rank, world_size)
    raise ConfigError(
        f"build_dataset: unknown config type {type(config).__name__}; "
        "expected SyntheticConfig, CriteoConfig, MovieLensConfig or ColumnarConfig"
    )
