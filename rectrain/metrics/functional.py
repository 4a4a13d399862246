"""Metrics of whole tensors as floats: AUC, log loss, normalised entropy, accuracy, calibration, recall@K.

AUC, log loss and NE are the engine's formulas (``rectrain.metrics.auc``, ``.ne``) applied to one tensor of
unweighted examples, so a number here equals the ``RecMetric`` one on the same examples.

``predictions`` are probabilities in [0, 1] (apply ``sigmoid`` to logits first), ``labels`` are 0/1. Sums are
taken in float64. Undefined values (AUC or NE without both classes, calibration with no positives) are NaN,
not a guess, so a dashboard shows a gap rather than a misleading number.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rectrain.metrics.accuracy import compute_accuracy_sum
from rectrain.metrics.auc import _compute_auc_helper
from rectrain.metrics.calibration import (
    CALIBRATION_DENOM,
    CALIBRATION_NUM,
    compute_calibration,
    get_calibration_states,
)
from rectrain.metrics.ne import ETA, compute_cross_entropy, compute_ne

LN2 = math.log(2.0)


def _check_pair(predictions: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ")
    return predictions.reshape(-1).to(torch.float64), labels.reshape(-1).to(torch.float64)


def auc(predictions: Tensor, labels: Tensor) -> float:
    """Exact ROC AUC: the probability that a random positive outscores a random negative, ties counting one
    half (``rectrain.metrics.auc``'s formula, unweighted). Scores need not be probabilities."""
    p, y = _check_pair(predictions, labels)
    return float(_compute_auc_helper(p, y, torch.ones_like(p), no_signal_value=math.nan))


def log_loss(predictions: Tensor, labels: Tensor) -> float:
    """Mean binary cross-entropy in nats, ``-(y ln p + (1 - y) ln(1 - p))`` (p clamped as in NE)."""
    p, y = _check_pair(predictions, labels)
    if p.numel() == 0:
        return math.nan
    ce = compute_cross_entropy(y, p, torch.ones_like(p), ETA).sum()
    return float(ce) / p.numel() * LN2


def normalized_entropy(predictions: Tensor, labels: Tensor) -> float:
    """Log loss over the entropy of the base rate (mean label); < 1 beats predicting the rate; NaN without
    both classes (the base rate's entropy is 0)."""
    p, y = _check_pair(predictions, labels)
    pos, neg = y.sum(), (1 - y).sum()
    if pos == 0 or neg == 0:
        return math.nan
    ce = compute_cross_entropy(y, p, torch.ones_like(p), ETA).sum()
    return float(compute_ne(ce, torch.tensor(float(p.numel())), pos, neg, ETA))


def accuracy(predictions: Tensor, labels: Tensor, threshold: float = 0.5) -> float:
    """Fraction of examples with ``(prediction >= threshold) == label``."""
    p, y = _check_pair(predictions, labels)
    if p.numel() == 0:
        return math.nan
    return float(compute_accuracy_sum(y, p, torch.ones_like(p), threshold)) / p.numel()


def calibration(predictions: Tensor, labels: Tensor) -> float:
    """Sum of predictions over sum of labels: 1.0 when the model predicts the base rate on average."""
    p, y = _check_pair(predictions, labels)
    sums = get_calibration_states(y, p, torch.ones_like(p))
    return (
        float(compute_calibration(sums[CALIBRATION_NUM], sums[CALIBRATION_DENOM]))
        if y.sum() > 0
        else math.nan
    )


def retrieval_scores(query_embeddings: Tensor, candidate_embeddings: Tensor) -> Tensor:
    """Dot-product scores ``[Q, C]`` of each query against each candidate (two-tower retrieval)."""
    if query_embeddings.dim() != 2 or candidate_embeddings.dim() != 2:
        raise ValueError("query_embeddings and candidate_embeddings must be 2-D [N, D]")
    if query_embeddings.shape[1] != candidate_embeddings.shape[1]:
        raise ValueError(
            f"embedding dims differ: queries {query_embeddings.shape[1]}, "
            f"candidates {candidate_embeddings.shape[1]}"
        )
    return query_embeddings @ candidate_embeddings.t()


def recall_at_k(
    scores: Tensor, positive_index: Tensor, k: int, candidate_items: Tensor | None = None
) -> float:
    """Fraction of queries whose positive candidate ranks in the top ``k`` of its row of ``scores [Q, C]``.

    Rank counts the candidates scored higher than the positive plus those tied with it (pessimistic), so a
    model that scores everything equally gets no credit for k < C. ``candidate_items [C]`` (int ids, e.g.
    ``torch.unique(..., return_inverse=True)``'s inverse) says which candidates are the same item: then the
    rank is among distinct items, so a copy of the positive's own item (a popular movie liked twice in one
    in-batch evaluation) never counts against it, and another item counts once, at its best score.
    """
    return float(recall_hits(scores, positive_index, k, candidate_items).to(torch.float64).mean())


def recall_hits(
    scores: Tensor, positive_index: Tensor, k: int, candidate_items: Tensor | None = None
) -> Tensor:
    """Per query, whether its positive is in the top ``k`` (bool ``[Q]``); see ``recall_at_k``."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be [Q, C], got shape {tuple(scores.shape)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    positive_index = positive_index.reshape(-1).to(torch.int64)
    if positive_index.numel() != scores.shape[0]:
        raise ValueError(f"positive_index has {positive_index.numel()} entries for {scores.shape[0]} queries")
    if (
        positive_index.numel()
        and not 0 <= int(positive_index.min()) <= int(positive_index.max()) < scores.shape[1]
    ):
        raise ValueError(f"positive_index must be in [0, {scores.shape[1]})")
    positive = scores.gather(1, positive_index[:, None])
    if candidate_items is not None:
        scores = _best_score_per_item(scores, candidate_items)
    # The positive's own item (or the positive itself) is among those >= it: not counted
    rank = (scores >= positive).sum(dim=1) - 1
    return rank < k


def _best_score_per_item(scores: Tensor, candidate_items: Tensor) -> Tensor:
    """``[Q, items]``: each query's highest score over the copies of each distinct item."""
    if candidate_items.shape != (scores.shape[1],):
        raise ValueError(
            f"candidate_items must hold one item id per candidate ({scores.shape[1]}), "
            f"got shape {tuple(candidate_items.shape)}"
        )
    _, items = torch.unique(candidate_items, return_inverse=True)
    index = items.to(scores.device)[None, :].expand_as(scores)
    width = int(items.max()) + 1 if items.numel() else 0
    best = scores.new_full((scores.shape[0], width), float("-inf"))
    return best.scatter_reduce(1, index, scores, reduce="amax")
