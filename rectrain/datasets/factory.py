"""``build_dataset``: the one place that maps a source's config to its dataset class."""

from __future__ import annotations

from torch.utils.data import IterableDataset

from rectrain.datasets.criteo import CriteoConfig, CriteoDataset
from rectrain.datasets.movielens import MovieLensConfig, MovieLensDataset
from rectrain.datasets.synthetic import SyntheticConfig, SyntheticDataset
from rectrain.datasets.windows import Holdout
from rectrain.errors import ConfigError

DatasetConfig = SyntheticConfig | CriteoConfig | MovieLensConfig


def build_dataset(
    config: DatasetConfig,
    rank: int = 0,
    world_size: int = 1,
    *,
    start_row: int = 0,
    select: Holdout | None = None,
) -> IterableDataset:
    """The dataset of ``config`` for ``rank`` of ``world_size``; use it with ``DataLoader(batch_size=None)``.

    File sources start at row ``start_row`` and read the rows ``select`` keeps (see ``windows``); synthetic
    data has no rows to start at. Raises ``ConfigError`` for a config type it does not know.
    """
    if isinstance(config, SyntheticConfig):
        if start_row or select is not None:
            raise ConfigError("build_dataset: synthetic data has no rows to start at or hold out")
        return SyntheticDataset(config, rank, world_size)
    if isinstance(config, CriteoConfig):
        return CriteoDataset(config, rank, world_size, start_row=start_row, select=select)
    if isinstance(config, MovieLensConfig):
        return MovieLensDataset(config, rank, world_size, start_row=start_row, select=select)
    raise ConfigError(
        f"build_dataset: unknown config type {type(config).__name__}; "
        "expected SyntheticConfig, CriteoConfig or MovieLensConfig"
    )
