"""Threshold filters for MCH eviction policies (``torchrec.modules.mc_modules``' ``*_threshold_filter``).

Each takes the counts of the distinct ids seen since the last eviction and returns ``(mask, threshold)``:
the ids whose mask is True may enter the table; the rest are not candidates this round, however empty the
table is. That keeps one-off ids (typos, bots, crawlers) from displacing ids that recur.
"""

import torch
from torch import Tensor


@torch.no_grad()
def dynamic_threshold_filter(
    id_counts: Tensor, threshold_skew_multiplier: float = 10.0
) -> tuple[Tensor, Tensor]:
    """Keep ids seen more than ``threshold_skew_multiplier`` times the mean count (total / distinct ids)."""
    # (1 / n) * multiplier, in that order: ids whose count sits exactly on the threshold fall on the same
    # side as in TorchRec.
    threshold = id_counts.sum() * ((1.0 / id_counts.numel()) * threshold_skew_multiplier)
    return id_counts > threshold, threshold


@torch.no_grad()
def average_threshold_filter(id_counts: Tensor) -> tuple[Tensor, Tensor]:
    """Keep ids seen more often than the mean count."""
    threshold = id_counts.float().mean()
    return id_counts > threshold, threshold


@torch.no_grad()
def probabilistic_threshold_filter(
    id_counts: Tensor, per_id_probability: float = 0.01
) -> tuple[Tensor, Tensor]:
    """Keep each id with probability ``1 - (1 - per_id_probability) ** count`` (draws from torch's RNG).

    An id seen once rarely gets in; one seen hundreds of times almost surely does. The returned threshold is
    the uniform draw each id's score was compared with.
    """
    miss = torch.full_like(id_counts, 1.0 - per_id_probability, dtype=torch.float)
    scores = 1.0 - torch.pow(miss, id_counts)
    threshold = torch.rand(id_counts.size(), device=id_counts.device)
    return scores > threshold, threshold
