"""Which share of a data source this process reads: one shard per (rank, DataLoader worker).

With ``world_size`` ranks each running ``num_workers`` DataLoader workers there are
``world_size * num_workers`` readers; reader ``rank * num_workers + worker_id`` takes every
``num_shards``-th item (line, batch index) starting at its own index, so the readers partition the source
exactly and deterministically. Without DataLoader workers (``num_workers=0``) the worker is 0 of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch.utils.data import get_worker_info

from rectrain.errors import ConfigError


@dataclass(frozen=True)
class ShardInfo:
    """This reader's index among ``num_shards`` readers."""

    index: int
    num_shards: int

    def owns(self, item: int) -> bool:
        """Whether item number ``item`` (0-based line or batch index) belongs to this reader."""
        return item % self.num_shards == self.index

    def owns_each(self, items: np.ndarray) -> np.ndarray:
        """``owns`` of every item number in ``items`` (a boolean mask), for readers that work in blocks."""
        return items % self.num_shards == self.index


def check_rank(rank: int, world_size: int) -> None:
    """Raise ``ConfigError`` unless ``0 <= rank < world_size``."""
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")


def current_shard(rank: int, world_size: int) -> ShardInfo:
    """The shard of the calling process: its rank, and its DataLoader worker when inside one."""
    check_rank(rank, world_size)
    info = get_worker_info()
    worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
    return ShardInfo(index=rank * num_workers + worker_id, num_shards=world_size * num_workers)


def worker_shard(rank: int, world_size: int) -> ShardInfo:
    """Only the DataLoader-worker split within this rank (for sources already split by rank)."""
    check_rank(rank, world_size)
    info = get_worker_info()
    return ShardInfo(0, 1) if info is None else ShardInfo(info.id, info.num_workers)
