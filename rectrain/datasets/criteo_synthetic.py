"""Write a Criteo-format TSV of synthetic rows whose labels a model can learn.

The main job and the tests train on it through the real Criteo reader (``CriteoDataset``), so the path a user
takes with the real dataset is the path exercised here. Every column has a small vocabulary of hex tokens
drawn Zipf-like (a few hot tokens, a long tail); every token has a hidden score, and a row's label is
Bernoulli(sigmoid(signal * (sum of token scores / sqrt(26) + dense term))). Some values are left
empty, as in Criteo.

A stream of files (the online main job) draws each file as one ``part`` of the same hidden task, and can
plant a change of behaviour: rows holding a ``planted`` token get ``planted_boost`` added to their logit.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rectrain.datasets.criteo import NUM_DENSE, NUM_SPARSE
from rectrain.errors import ConfigError


@dataclass
class SyntheticCriteoSpec:
    """How many rows, how many distinct tokens per categorical column, how learnable, which seed."""

    num_rows: int = 100_000
    vocab_size: int = 1_000
    missing_rate: float = 0.02
    signal: float = 2.0
    zipf_alpha: float = 1.05
    seed: int = 0
    # Part of a stream: the hidden task (token hexes and scores) comes from ``seed`` alone, the rows from
    # (seed, part); part 0 is the single-file layout (its rows continue the task's generator).
    part: int = 0
    # (column, token rank) pairs, rank 0 the most frequent token: a row holding any of them gets
    # ``planted_boost`` added to its logit (after ``signal``), so those ids click far more than before.
    planted: tuple[tuple[int, int], ...] = ()
    planted_boost: float = 0.0

    def __post_init__(self) -> None:
        if self.num_rows < 1:
            raise ConfigError(f"SyntheticCriteoSpec.num_rows must be >= 1, got {self.num_rows}")
        if self.vocab_size < 1:
            raise ConfigError(f"SyntheticCriteoSpec.vocab_size must be >= 1, got {self.vocab_size}")
        if not 0.0 <= self.missing_rate < 1.0:
            raise ConfigError(f"SyntheticCriteoSpec.missing_rate must be in [0, 1), got {self.missing_rate}")
        if self.part < 0:
            raise ConfigError(f"SyntheticCriteoSpec.part must be >= 0, got {self.part}")
        for column, rank in self.planted:
            if not (0 <= column < NUM_SPARSE and 0 <= rank < self.vocab_size):
                raise ConfigError(
                    f"SyntheticCriteoSpec.planted: ({column}, {rank}) needs a column in 0..{NUM_SPARSE - 1} "
                    f"and a token rank in 0..{self.vocab_size - 1}"
                )


def synthetic_criteo_token(spec: SyntheticCriteoSpec, column: int, rank: int) -> str:
    """The hex text of token ``rank`` (0: most frequent) of categorical ``column`` in ``spec``'s task."""
    token_hex, _, _, _ = _task(spec)
    return f"{int(token_hex[column, rank]):08x}"


def _task(spec: SyntheticCriteoSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator]:
    """The hidden task of ``spec.seed`` (token hexes, token scores, dense weights) and the rows' generator."""
    gen = torch.Generator().manual_seed(spec.seed)
    token_hex = torch.randint(0, 2**31 - 1, (NUM_SPARSE, spec.vocab_size), generator=gen)
    token_score = torch.rand(NUM_SPARSE, spec.vocab_size, generator=gen) * 2 - 1
    dense_weight = torch.randn(NUM_DENSE, generator=gen) * 0.3
    if spec.part:
        gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + spec.part)
    return token_hex, token_score, dense_weight, gen


def write_synthetic_criteo(path: str | os.PathLike, spec: SyntheticCriteoSpec) -> Path:
    """Write ``spec.num_rows`` rows to ``path`` (gzip when it ends in ``.gz``), atomically; return it."""
    path = Path(path)
    token_hex, token_score, dense_weight, gen = _task(spec)

    ranks = torch.arange(1, spec.vocab_size + 1, dtype=torch.float64)
    zipf = ranks.pow(-spec.zipf_alpha)
    tokens = torch.multinomial(zipf / zipf.sum(), spec.num_rows * NUM_SPARSE, replacement=True, generator=gen)
    tokens = tokens.view(spec.num_rows, NUM_SPARSE)
    dense = torch.poisson(torch.full((spec.num_rows, NUM_DENSE), 4.0), generator=gen).long()
    cat_missing = torch.rand(spec.num_rows, NUM_SPARSE, generator=gen) < spec.missing_rate
    dense_missing = torch.rand(spec.num_rows, NUM_DENSE, generator=gen) < spec.missing_rate

    score = token_score.gather(1, tokens.t()).t().masked_fill(cat_missing, 0.0).sum(dim=1) / NUM_SPARSE**0.5
    dense_term = (torch.log1p(dense.float()).masked_fill(dense_missing, 0.0) - 1.5) @ dense_weight
    logit = spec.signal * (score + dense_term)
    if spec.planted:
        planted = torch.zeros(spec.num_rows, dtype=torch.bool)
        for column, rank in spec.planted:
            planted |= (tokens[:, column] == rank) & ~cat_missing[:, column]
        logit = logit + spec.planted_boost * planted
    labels = torch.bernoulli(torch.sigmoid(logit), generator=gen).long()
    hexes = token_hex.gather(1, tokens.t()).t()

    tmp = path.with_name(f".{path.name}.tmp")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(tmp, "wt") as f:
        for row in range(spec.num_rows):
            ints = [
                "" if miss else str(v) for v, miss in zip(dense[row].tolist(), dense_missing[row].tolist())
            ]
            cats = [
                "" if miss else f"{v:08x}" for v, miss in zip(hexes[row].tolist(), cat_missing[row].tolist())
            ]
            f.write("\t".join([str(int(labels[row])), *ints, *cats]) + "\n")
    os.replace(tmp, path)
    return path
