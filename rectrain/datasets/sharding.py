"""Which share of a rank's data a DataLoader worker reads, and the rank argument check.

A rank's data is split between its ``num_workers`` DataLoader workers by item: worker ``w`` takes items
``w, w + num_workers, ...`` (windows of a file source, batch indices of synthetic data), and the DataLoader
returns them in that round-robin order, so a rank's batches are the same whatever the number of workers.
Without DataLoader workers (``num_workers=0``) the worker is 0 of 1. How ranks split a file source is the
job of ``windows``.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def check_rank(rank: int, world_size: int) -> None:
    """Raise ``ConfigError`` unless ``0 <= rank < world_size``."""
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")


def worker_shard(rank: int, world_size: int) -> ShardInfo:
    """Only the DataLoader-worker split within this rank (for sources already split by rank)."""
    check_rank(rank, world_size)
    info = get_worker_info()
    return ShardInfo(0, 1) if info is None else ShardInfo(info.id, info.num_workers)
