"""Two-tower retrieval: towers, in-batch softmax loss by hand, recall@K of a trained model on MovieLens."""

import math
import random

import pytest
import torch

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig, KeyedJaggedTensor
from rectrain.datasets import MovieLensConfig, build_dataset
from rectrain.errors import ConfigError
from rectrain.models import (
    Batch,
    ModelConfig,
    TwoTower,
    TwoTowerTrainTask,
    build_train_model,
    evaluate_recall_at_k,
    in_batch_softmax_loss,
)
from rectrain.models.two_tower import candidate_items, positive_mask


def _hand_softmax_loss(q, c, temperature):
    """Mean over rows i of -log(exp(<q_i, c_i>/t) / sum_j exp(<q_i, c_j>/t)), in plain Python floats."""
    q, c = q.tolist(), c.tolist()
    total = 0.0
    for i, qi in enumerate(q):
        scores = [sum(a * b for a, b in zip(qi, cj)) / temperature for cj in c]
        total += -(scores[i] - math.log(sum(math.exp(s) for s in scores)))
    return total / len(q)


def test_in_batch_softmax_loss_matches_hand_computation():
    q = torch.tensor([[1.0, 0.0], [0.5, -1.0], [2.0, 1.0]])
    c = torch.tensor([[0.3, 0.2], [-1.0, 1.0], [0.0, 0.5]])
    for temperature in (1.0, 0.25):
        loss = in_batch_softmax_loss(q, c, temperature)
        assert loss.item() == pytest.approx(_hand_softmax_loss(q, c, temperature), rel=1e-6)


def test_no_positive_pairs_give_zero_loss_that_still_backpropagates():
    q = torch.randn(0, 3, requires_grad=True)
    loss = in_batch_softmax_loss(q, torch.randn(0, 3))
    loss.backward()
    assert loss.item() == 0.0 and q.grad is not None


def test_positive_mask_skips_zero_labels_only_when_binary():
    assert positive_mask(torch.tensor([1.0, 0.0, 1.0])).tolist() == [True, False, True]
    assert positive_mask(torch.tensor([4.5, 3.0, 0.0])).tolist() == [True, True, True]


def _two_tower(layer_sizes=(8, 4), rows=30):
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name="users", num_embeddings=rows, embedding_dim=8, feature_names=["user_id"]),
        EmbeddingBagConfig(name="movies", num_embeddings=rows, embedding_dim=4, feature_names=["movie_id"]),
    ]
    return TwoTower(EmbeddingBagCollection(tables), list(layer_sizes))


def _batch(users, movies, labels):
    ids = torch.tensor(users + movies)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["user_id", "movie_id"], values=ids, lengths=torch.ones(len(ids), dtype=torch.int32)
    )
    return Batch(torch.zeros(len(users), 0), kjt, torch.tensor(labels, dtype=torch.float32))


def test_towers_read_their_own_features():
    tt = _two_tower()
    assert tt.query_features == ["user_id"] and tt.candidate_features == ["movie_id"]
    batch = _batch([1, 2, 3], [4, 5, 6], [1, 0, 1])
    q, c = tt(batch.sparse_features)
    assert q.shape == c.shape == (3, 4)
    pooled = tt.ebc(batch.sparse_features)
    torch.testing.assert_close(q, tt.query_proj(pooled["user_id"]))
    torch.testing.assert_close(c, tt.candidate_proj(pooled["movie_id"]))
    assert (q < 0).any()  # the last tower layer is linear (no ReLU), so scores can take either sign


def test_train_task_loss_is_the_softmax_over_positive_pairs():
    task = TwoTowerTrainTask(_two_tower(), temperature=0.5)
    batch = _batch([1, 2, 3, 4], [5, 6, 7, 8], [1, 0, 1, 1])
    loss, (detached, logits, labels) = task(batch)
    q, c = task.two_tower(batch.sparse_features)
    keep = [0, 2, 3]
    assert loss.item() == pytest.approx(_hand_softmax_loss(q[keep].detach(), c[keep].detach(), 0.5), rel=1e-5)
    torch.testing.assert_close(logits, (q * c).sum(1).detach())
    torch.testing.assert_close(task.prediction_model(batch.dense_features, batch.sparse_features), logits)
    assert not detached.requires_grad and labels.tolist() == [1, 0, 1, 1]


def test_bad_arguments_raise_config_errors():
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        TwoTowerTrainTask(_two_tower(), temperature=0.0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=5, embedding_dim=4)])
    with pytest.raises(ConfigError, match="exactly 2 tables"):
        TwoTower(ebc, [4])
    with pytest.raises(ConfigError, match=r"query_features\[0\] 'x' is not a feature"):
        TwoTower(ebc, [4], query_features=["x"], candidate_features=["t"])


USERS = 200


def _partner(user):
    return (7 * user + 3) % USERS


def _write_ratings(path, seed=0):
    """ml-1m layout: each user rates its partner movie 5 (positive) and one other movie 1 (negative)."""
    rng = random.Random(seed)
    lines = []
    for user in range(USERS):
        lines.append(f"{user}::{_partner(user)}::5::978300760")
        other = rng.choice([m for m in range(USERS) if m != _partner(user)])
        lines.append(f"{user}::{other}::1::978300761")
    rng.shuffle(lines)
    path.write_text("\n".join(lines) + "\n")


def test_trained_two_tower_recall_beats_chance_on_movielens(tmp_path):
    _write_ratings(tmp_path / "ratings.dat")
    data = MovieLensConfig(
        paths=[str(tmp_path / "ratings.dat")],
        batch_size=64,
        num_user_embeddings=USERS,
        num_movie_embeddings=USERS,
    )
    batches = list(build_dataset(data))
    cfg = ModelConfig(
        kind="two_tower",
        tables=[
            EmbeddingBagConfig(
                name="users", num_embeddings=USERS, embedding_dim=16, feature_names=["user_id"]
            ),
            EmbeddingBagConfig(
                name="movies", num_embeddings=USERS, embedding_dim=16, feature_names=["movie_id"]
            ),
        ],
        dense_in_features=0,
        tower_layer_sizes=[32, 16],
    )
    torch.manual_seed(0)
    task = build_train_model(cfg, fused_optimizer=FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=0.2))
    opt = torch.optim.Adam([p for n, p in task.named_parameters() if ".ebc." not in n], lr=0.01)
    k = 5
    positives = sum(int(b.labels.sum()) for b in batches) / len(batches)
    chance = k / positives
    before = evaluate_recall_at_k(task, batches, k)
    for _ in range(8):
        for batch in batches:
            loss, _ = task(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
    after = evaluate_recall_at_k(task, batches, k)
    assert after > max(0.6, 3 * chance, before + 0.3), (before, after, chance)


def test_candidate_items_name_equal_candidates_alike():
    ebc = EmbeddingBagCollection(
        [
            EmbeddingBagConfig(name="u", num_embeddings=10, embedding_dim=4, feature_names=["user"]),
            EmbeddingBagConfig(name="m", num_embeddings=10, embedding_dim=4, feature_names=["movie"]),
        ]
    )
    two_tower = TwoTower(ebc, [4], query_features=["user"], candidate_features=["movie"])
    # movie bags per example: [1, 2], [1], [1, 2], [], [2, 1], []
    kjt = KeyedJaggedTensor(
        keys=["user", "movie"],
        lengths=torch.tensor([1, 1, 1, 1, 1, 1, 2, 1, 2, 0, 2, 0]),
        values=torch.tensor([0, 1, 2, 3, 4, 5, 1, 2, 1, 1, 2, 2, 1]),
    )
    items = candidate_items(two_tower, kjt).tolist()
    assert items[0] == items[2] and items[3] == items[5]
    assert len({items[0], items[1], items[3], items[4]}) == 4


def test_recall_counts_no_copy_of_the_own_item_against_it():
    """Every liked pair is the same movie: one distinct candidate, so each query finds it first."""
    cfg = ModelConfig(
        kind="two_tower",
        tables=[
            EmbeddingBagConfig(name="users", num_embeddings=8, embedding_dim=4, feature_names=["user_id"]),
            EmbeddingBagConfig(name="movies", num_embeddings=8, embedding_dim=4, feature_names=["movie_id"]),
        ],
        dense_in_features=0,
        tower_layer_sizes=[4],
    )
    task = build_train_model(cfg)
    kjt = KeyedJaggedTensor(
        keys=["user_id", "movie_id"],
        lengths=torch.ones(8, dtype=torch.int64),
        values=torch.tensor([0, 1, 2, 3, 3, 3, 3, 3]),
    )
    batch = Batch(torch.zeros(4, 0), kjt, torch.ones(4))
    assert evaluate_recall_at_k(task, [batch], k=1) == 1.0
