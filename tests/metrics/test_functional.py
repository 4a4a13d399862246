"""Metric formulas against hand-computed values and a brute-force pairwise AUC."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rectrain.metrics import (
    accuracy,
    auc,
    calibration,
    log_loss,
    normalized_entropy,
    recall_at_k,
    retrieval_scores,
)

LABELS = torch.tensor([0.0, 0.0, 1.0, 1.0])


def test_auc_perfect_reversed_and_all_tied():
    assert auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), LABELS) == 1.0
    assert auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), LABELS) == 0.0
    assert auc(torch.full((4,), 0.7), LABELS) == 0.5


def test_auc_small_hand_example_with_a_tie():
    # positives 0.8, 0.4; negatives 0.4, 0.3, 0.9. Pairs (pos, neg) won: 0.8 beats 0.4, 0.3 -> 2;
    # 0.4 beats 0.3, ties 0.4 -> 1.5. Total 3.5 of 6.
    scores = torch.tensor([0.8, 0.4, 0.4, 0.3, 0.9])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    assert auc(scores, labels) == pytest.approx(3.5 / 6)


def test_auc_is_nan_with_one_class():
    assert math.isnan(auc(torch.tensor([0.1, 0.9]), torch.tensor([1.0, 1.0])))


def _pairwise_auc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@given(
    st.lists(
        st.tuples(st.integers(0, 5).map(lambda x: x / 5), st.integers(0, 1)), min_size=2, max_size=60
    ).filter(lambda rows: 0 < sum(y for _, y in rows) < len(rows))
)
def test_auc_matches_brute_force_pairwise_count(rows):
    scores, labels = zip(*rows)
    expected = _pairwise_auc(list(scores), list(labels))
    got = auc(torch.tensor(scores), torch.tensor(labels, dtype=torch.float32))
    assert got == pytest.approx(expected, abs=1e-12)


def test_log_loss_ne_accuracy_calibration_by_hand():
    p = torch.tensor([0.9, 0.2, 0.6, 0.4])
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    expected_loss = -(math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.4)) / 4
    assert log_loss(p, y) == pytest.approx(expected_loss)
    base_entropy = -(0.5 * math.log(0.5) + 0.5 * math.log(0.5))  # base rate 2/4
    assert normalized_entropy(p, y) == pytest.approx(expected_loss / base_entropy)
    assert accuracy(p, y) == pytest.approx(0.5)  # 0.9 right, 0.2 right, 0.6 wrong, 0.4 wrong
    assert calibration(p, y) == pytest.approx(2.1 / 2.0)


def test_predicting_the_base_rate_has_ne_one():
    y = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert normalized_entropy(torch.full((4,), 0.25), y) == pytest.approx(1.0)
    assert math.isnan(normalized_entropy(torch.full((2,), 0.5), torch.ones(2)))


def test_log_loss_of_a_confident_mistake_is_finite():
    assert math.isfinite(log_loss(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])))


def test_mismatched_shapes_are_an_error():
    with pytest.raises(ValueError, match="differ"):
        auc(torch.zeros(3), torch.zeros(4))


def test_recall_at_k_hand_example():
    scores = torch.tensor(
        [
            [0.9, 0.1, 0.5, 0.3],  # positive 2 ranks 2nd
            [0.2, 0.8, 0.1, 0.7],  # positive 0 ranks 3rd
            [0.4, 0.4, 0.4, 0.4],  # positive 3 tied with all: ranks 4th (pessimistic)
        ]
    )
    positive = torch.tensor([2, 0, 3])
    assert recall_at_k(scores, positive, 1) == 0.0
    assert recall_at_k(scores, positive, 2) == pytest.approx(1 / 3)
    assert recall_at_k(scores, positive, 3) == pytest.approx(2 / 3)
    assert recall_at_k(scores, positive, 4) == 1.0


def test_recall_at_k_from_embeddings_in_batch_positives():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    candidates = torch.tensor([[2.0, 0.0], [1.0, 0.5]])  # query 1 prefers candidate 1: its positive
    scores = retrieval_scores(queries, candidates)
    assert scores.tolist() == [[2.0, 1.0], [0.0, 0.5]]
    assert recall_at_k(scores, torch.arange(2), 1) == 1.0
    with pytest.raises(ValueError, match="positive_index"):
        recall_at_k(scores, torch.tensor([0, 2]), 1)
