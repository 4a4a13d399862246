"""Write MovieLens-format ratings from a hidden taste model, and the best recall@K any model can reach on them.

Users and movies have hidden taste vectors; a user picks movies with probability
``softmax(taste * <u, m> + popularity_m)`` and rates each ``clip(round(3 + affinity * <u, m> + noise), 1, 5)``.
Users' activity and movies' popularity are Zipf-like, as in MovieLens. Rows are written in ml-1m's
``ratings.dat`` layout (``UserID::MovieID::Rating::Timestamp``, ids from 1).

``RatingsRule.oracle_recall`` scores held-out rows the way ``rectrain``'s evaluation does (each batch's
positive pairs, recall@K of a query's own candidate among the batch's candidates) with the true posterior
``log P(m | u, liked) - log P(m | liked)``: whether a candidate of the batch is the query's own one depends on
how much more likely the user made it than the crowd did. No model ranks better on average.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rectrain.errors import ConfigError
from rectrain.metrics.functional import recall_hits


@dataclass(frozen=True)
class RatingsRule:
    """Sizes and strengths of the hidden taste model (see the module docstring)."""

    num_users: int = 2_000
    num_movies: int = 1_000
    dim: int = 8
    taste: float = 1.5
    affinity: float = 1.0
    noise: float = 0.8
    popularity: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_users", "num_movies", "dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"RatingsRule.{name} must be >= 1, got {getattr(self, name)}")
        if not self.noise > 0:
            raise ConfigError(f"RatingsRule.noise must be > 0, got {self.noise}")

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(user vectors [U, d], movie vectors [M, d], movie popularity [M]) of this rule."""
        g = torch.Generator().manual_seed(self.seed)
        users = torch.randn(self.num_users, self.dim, generator=g) / self.dim**0.5
        movies = torch.randn(self.num_movies, self.dim, generator=g)
        popularity = torch.randn(self.num_movies, generator=g) * self.popularity
        return users, movies, popularity

    def _user_weights(self) -> torch.Tensor:
        ranks = torch.arange(1, self.num_users + 1, dtype=torch.float64)
        return (ranks.pow(-0.7) / ranks.pow(-0.7).sum()).float()

    def _log_choice_and_like(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(log P(movie | user) [U, M], log P(liked | user, movie) [U, M])."""
        users, movies, popularity = self._draw()
        affinity = users @ movies.t()
        log_choice = torch.log_softmax(self.taste * affinity + popularity, dim=1)
        normal = torch.distributions.Normal(0.0, 1.0)
        like = normal.cdf((self.affinity * affinity - 0.5) / self.noise).clamp_min(1e-12)
        return log_choice, like.log()

    def write(self, path: str | os.PathLike, num_ratings: int, seed: int) -> Path:
        """Write ``num_ratings`` rows to ``path`` (atomically); rows of one seed are a fixed sample."""
        path = Path(path)
        log_choice, _ = self._log_choice_and_like()
        users_vec, movies_vec, _ = self._draw()
        g = torch.Generator().manual_seed(seed)
        users = torch.multinomial(self._user_weights(), num_ratings, replacement=True, generator=g)
        movies = torch.multinomial(log_choice[users].exp(), 1, generator=g).squeeze(1)
        affinity = (users_vec[users] * movies_vec[movies]).sum(1)
        noise = torch.randn(num_ratings, generator=g) * self.noise
        ratings = (3 + self.affinity * affinity + noise).round().clamp(1, 5).long()
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w") as f:
            for i, (u, m, r) in enumerate(zip(users.tolist(), movies.tolist(), ratings.tolist())):
                f.write(f"{u + 1}::{m + 1}::{r}::{978_300_000 + i}\n")
        os.replace(tmp, path)
        return path

    def oracle_scores(self) -> torch.Tensor:
        """``[U, M]``: log P(m | u, liked) - log P(m | liked), the best retrieval score of (user, movie)."""
        log_choice, log_like = self._log_choice_and_like()
        joint = log_choice + log_like  # log P(m, liked | u) up to a per-user constant
        marginal = torch.logsumexp(joint + self._user_weights().log()[:, None], dim=0)
        return joint - marginal[None, :]

    def oracle_recall(self, path: str | os.PathLike, batch_size: int, k: int, threshold: float = 4.0) -> float:
        """Recall@``k`` of the true scores on ``path``'s rows, batched as a single reader batches them."""
        scores = self.oracle_scores()
        rows = [line.split("::") for line in Path(path).read_text().splitlines()]
        users = torch.tensor([int(r[0]) - 1 for r in rows])
        movies = torch.tensor([int(r[1]) - 1 for r in rows])
        liked = torch.tensor([float(r[2]) >= threshold for r in rows])
        hits, pairs = 0, 0
        for start in range(0, len(rows), batch_size):
            keep = liked[start : start + batch_size]
            u, m = users[start : start + batch_size][keep], movies[start : start + batch_size][keep]
            if len(u) == 0:
                continue
            batch_scores = scores[u][:, m]
            hits += int(recall_hits(batch_scores, torch.arange(len(u)), k).sum())
            pairs += len(u)
        return hits / pairs if pairs else float("nan")
