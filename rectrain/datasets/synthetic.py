"""Synthetic batches with learnable labels, in Criteo's shape or the standard multi-id workload shape.

Ids are uniform or Zipf-distributed per table. Labels can be learned: every (feature, id) has a hidden score
in [-1, 1) given by a fixed integer hash of (seed, feature, id) (no table is stored, so tables may be huge),
and each example's logit is ``signal * (sum over features of the mean score of its ids + dense . w)``,
labels ~ Bernoulli(sigmoid(logit)). A model that learns the scores reaches AUC well above 0.5.

Batch ``i`` of rank ``r`` depends only on (seed, r, i): it is the same whatever the number of DataLoader
workers; worker ``w`` of ``n`` yields the batches with ``i % n == w``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Generator, Tensor
from torch.utils.data import IterableDataset

from rectrain.datasets.batching import make_batch
from rectrain.datasets.sharding import check_rank, worker_shard
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch

_MASK32 = 0xFFFFFFFF
_SCRAMBLE = 2_654_435_761  # prime: multiplying by it permutes ids mod any table size it does not divide


@dataclass
class SyntheticConfig:
    """Shape and distribution of the synthetic data; ``num_batches`` per rank and epoch.

    ``ids_per_feature = (lo, hi)``: each example has between lo and hi ids (inclusive, uniform) per feature.
    ``distribution``: ``"uniform"`` or ``"zipf"`` (exponent ``zipf_alpha``; hot ids are scattered over the
    table by a fixed permutation so row-wise shards share them). ``signal`` scales the learnable logit.
    """

    batch_size: int = 1024
    num_batches: int = 100
    num_dense: int = 13
    num_sparse: int = 26
    num_embeddings: int | list[int] = 100_000
    ids_per_feature: tuple[int, int] = (1, 1)
    distribution: str = "uniform"
    zipf_alpha: float = 1.1
    signal: float = 2.0
    seed: int = 0
    feature_prefix: str = "cat_"

    @classmethod
    def criteo(cls, **overrides: Any) -> SyntheticConfig:
        """Criteo's shape: 13 dense, 26 categorical features of one id each."""
        return cls(**{"num_dense": 13, "num_sparse": 26, "ids_per_feature": (1, 1), **overrides})

    @classmethod
    def standard_workload(cls, **overrides: Any) -> SyntheticConfig:
        """The standard benchmark workload: 13 dense, 8 features of 1..39 ids per example."""
        return cls(**{"num_dense": 13, "num_sparse": 8, "ids_per_feature": (1, 39), **overrides})

    def __post_init__(self) -> None:
        lo, hi = self.ids_per_feature
        checks = [
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.num_batches >= 0, f"num_batches must be >= 0, got {self.num_batches}"),
            (self.num_dense >= 0 and self.num_sparse >= 1, "needs num_dense >= 0 and num_sparse >= 1"),
            (0 <= lo <= hi, f"ids_per_feature must be (lo, hi) with 0 <= lo <= hi, got {(lo, hi)}"),
            (
                self.distribution in ("uniform", "zipf"),
                f"distribution {self.distribution!r} is not uniform/zipf",
            ),
            (self.zipf_alpha > 0 and self.zipf_alpha != 1.0, "zipf_alpha must be > 0 and != 1"),
            (all(r >= 1 for r in self.table_rows()), "num_embeddings must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"SyntheticConfig: {message}")

    def table_rows(self) -> list[int]:
        """Rows of each table, in feature order."""
        if isinstance(self.num_embeddings, int):
            return [self.num_embeddings] * self.num_sparse
        if len(self.num_embeddings) != self.num_sparse:
            raise ConfigError(f"SyntheticConfig.num_embeddings needs 1 or {self.num_sparse} entries")
        return list(self.num_embeddings)

    @property
    def feature_names(self) -> list[str]:
        return [f"{self.feature_prefix}{i}" for i in range(self.num_sparse)]


def hidden_score(ids: Tensor, feature: int, seed: int) -> Tensor:
    """The hidden score in [-1, 1) of each id of table ``feature``: a fixed 32-bit integer hash."""
    x = ((ids & _MASK32) * 0x9E3779B1 + (ids >> 32) + feature * 0x85EBCA77 + seed * 0xC2B2AE3D) & _MASK32
    for _ in range(2):
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    x = x ^ (x >> 16)
    return x.to(torch.float64).div(2.0**31).sub(1.0).to(torch.float32)


def sample_ids(n: int, rows: int, cfg: SyntheticConfig, gen: Generator) -> Tensor:
    """``n`` ids in ``[0, rows)``: uniform, or a bounded power law (continuous Zipf) scattered by a prime."""
    if cfg.distribution == "uniform":
        return torch.randint(0, rows, (n,), generator=gen, dtype=torch.int64)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    a = 1.0 - cfg.zipf_alpha
    ranks = ((((rows + 1.0) ** a - 1.0) * u + 1.0) ** (1.0 / a)).floor().to(torch.int64) - 1
    ranks = ranks.clamp_(0, rows - 1)
    if rows <= 2**31 and rows % _SCRAMBLE:
        return (ranks * (_SCRAMBLE % rows)) % rows
    return ranks


class SyntheticDataset(IterableDataset):
    """``num_batches`` learnable synthetic batches for this rank, split over DataLoader workers."""

    def __init__(self, config: SyntheticConfig, rank: int = 0, world_size: int = 1) -> None:
        check_rank(rank, world_size)
        self.config, self.rank, self.world_size = config, rank, world_size
        gen = torch.Generator().manual_seed(config.seed)
        self.dense_weight = torch.randn(config.num_dense, generator=gen) / max(1, config.num_dense) ** 0.5

    def __len__(self) -> int:
        return self.config.num_batches

    def __iter__(self) -> Iterator[Batch]:
        shard = worker_shard(self.rank, self.world_size)
        for i in range(self.config.num_batches):
            if shard.owns(i):
                yield self.batch(i)

    def batch(self, index: int) -> Batch:
        """Batch number ``index`` of this rank (a pure function of seed, rank and index)."""
        cfg = self.config
        gen = torch.Generator().manual_seed(((cfg.seed * 1_000_003 + self.rank) * 1_000_003 + index) % 2**63)
        b = cfg.batch_size
        dense = torch.rand(b, cfg.num_dense, generator=gen)
        logit = (dense - 0.5) @ self.dense_weight
        values, lengths = [], []
        for f, rows in enumerate(cfg.table_rows()):
            lo, hi = cfg.ids_per_feature
            lens = torch.randint(lo, hi + 1, (b,), generator=gen, dtype=torch.int32)
            ids = sample_ids(int(lens.sum()), rows, cfg, gen)
            example = torch.repeat_interleave(torch.arange(b), lens.to(torch.int64))
            sums = torch.zeros(b).index_add_(0, example, hidden_score(ids, f, cfg.seed))
            logit += sums / lens.clamp(min=1)
            values.append(ids)
            lengths.append(lens)
        prob = torch.sigmoid(cfg.signal * logit / cfg.num_sparse**0.5)
        labels = torch.bernoulli(prob, generator=gen)
        return make_batch(dense, cfg.feature_names, values, lengths, labels)
