"""``torchrec.distributed.planner.stats`` at rectrain's path (``rectrain.planner.stats``)."""

from rectrain.planner.stats import (
    EmbeddingStats,
    NoopEmbeddingStats,
    _calc_max_chi_sq_divergence,
    _calc_max_kl_divergence,
    _chi_sq_divergence,
    _kl_divergence,
    _normalize_float,
    _normalize_int,
    _total_distance,
    _total_variation,
)

__all__ = [
    "EmbeddingStats",
    "NoopEmbeddingStats",
    "_calc_max_chi_sq_divergence",
    "_calc_max_kl_divergence",
    "_chi_sq_divergence",
    "_kl_divergence",
    "_normalize_float",
    "_normalize_int",
    "_total_distance",
    "_total_variation",
]
