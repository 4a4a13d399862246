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


def test_recall_at_k_ranks_among_distinct_items():
    # candidates 0 and 2 are the same item (a movie two users liked), as are 1 and 3
    items = torch.tensor([5, 9, 5, 9])
    scores = torch.tensor(
        [
            [0.5, 0.4, 0.5, 0.1],  # positive 0: its own item's copy tied with it, item 9 below
            [0.7, 0.2, 0.3, 0.8],  # positive 3: item 5 (best copy 0.7) below it, its own copy 0.2 ignored
            [0.4, 0.4, 0.4, 0.4],  # positive 2: tied with item 9: counts against it (pessimistic)
        ]
    )
    positive = torch.tensor([0, 3, 2])
    assert recall_at_k(scores, positive, 1) == pytest.approx(1 / 3)  # without items: the copy counts
    assert recall_at_k(scores, positive, 2) == pytest.approx(2 / 3)
    assert recall_at_k(scores, positive, 1, items) == pytest.approx(2 / 3)
    assert recall_at_k(scores, positive, 2, items) == 1.0
    with pytest.raises(ValueError, match="candidate_items"):
        recall_at_k(scores, positive, 1, items[:3])


@given(
    st.integers(1, 6),
    st.integers(1, 8),
    st.integers(1, 8),
    st.integers(0, 2**31 - 1),
)
def test_recall_at_k_with_distinct_items_is_plain_recall(queries, candidates, k, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (queries, candidates), generator=g).float()  # ties are common
    positive = torch.randint(0, candidates, (queries,), generator=g)
    items = torch.randperm(candidates, generator=g) * 3
    assert recall_at_k(scores, positive, k, items) == recall_at_k(scores, positive, k)
    # Copying every candidate (each item twice) changes nothing either
    doubled = torch.cat([scores, scores], dim=1)
    assert recall_at_k(doubled, positive, k, torch.cat([items, items])) == recall_at_k(scores, positive, k)


def test_recall_at_k_from_embeddings_in_batch_positives():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    candidates = torch.tensor([[2.0, 0.0], [1.0, 0.5]])  # query 1 prefers candidate 1: its positive
    scores = retrieval_scores(queries, candidates)
    assert scores.tolist() == [[2.0, 1.0], [0.0, 0.5]]
    assert recall_at_k(scores, torch.arange(2), 1) == 1.0
    with pytest.raises(ValueError, match="positive_index"):
        recall_at_k(scores, torch.tensor([0, 2]), 1)
