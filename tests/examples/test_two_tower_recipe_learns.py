"""The two-tower MovieLens recipe learns: on MovieLens-format ratings from a hidden taste model, its
held-out recall@10 after two epochs on 1 and 2 ranks reaches a plain-PyTorch reference's (two ``nn.Embedding``
of dim 64, MLP towers 128-64, Adam 1e-3, in-batch softmax over the liked pairs) trained on the same rows,
less 0.01. Both are measured alike: a liked pair's movie ranked among the distinct movies of its batch's liked
pairs (400 movies, ~470 liked pairs a batch: a popular movie appears several times, and counting its copies
as ties against it, as the recipe's evaluation once did, read the plain model's 0.185 as 0.023).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rectrain.metrics.functional import recall_hits
from rectrain.train.config import RunConfig
from rectrain.train.guard import TrainingDiverged
from rectrain.train.job import TrainJob
from tests.distributed.multiprocess import run_multiprocess
from tests.train.test_job import EXAMPLES

USERS, MOVIES, TRAIN_ROWS, EVAL_ROWS, EPOCHS, K = 600, 400, 30_000, 6_000, 2, 10


def write_ratings(tmp_path):
    """Users pick movies close to their hidden taste and rate them by it: ``(train, eval)`` ml-1m files."""
    g = torch.Generator().manual_seed(7)
    users, movies = torch.randn(USERS, 8, generator=g), torch.randn(MOVIES, 8, generator=g)
    affinity = users @ movies.t() / 8**0.5
    choice = torch.softmax(1.5 * affinity + torch.randn(MOVIES, generator=g), dim=1)
    paths = []
    for name, rows in [("train.dat", TRAIN_ROWS), ("eval.dat", EVAL_ROWS)]:
        u = torch.randint(0, USERS, (rows,), generator=g)
        m = torch.multinomial(choice[u], 1, generator=g).squeeze(1)
        rating = (3.5 + 1.5 * affinity[u, m] + 0.8 * torch.randn(rows, generator=g)).round().clamp(1, 5)
        lines = [
            f"{a + 1}::{b + 1}::{int(r)}::{978_300_000 + i}" for i, (a, b, r) in enumerate(zip(u, m, rating))
        ]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        paths.append(tmp_path / name)
    return paths


def liked_pairs(path):
    rows = [line.split("::") for line in path.read_text().splitlines()]
    pairs = torch.tensor([[int(r[0]), int(r[1]), float(r[2]) >= 4.0] for r in rows])
    return pairs[:, :2], pairs[:, 2].bool()


def plain_reference_recall(train_path, eval_path, batch_size):
    torch.manual_seed(0)

    def tower(rows):
        return nn.Sequential(nn.Embedding(rows, 64), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))

    query, candidate = tower(USERS + 1), tower(MOVIES + 1)
    opt = torch.optim.Adam([*query.parameters(), *candidate.parameters()], lr=1e-3)
    ids, liked = liked_pairs(train_path)
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(ids)).split(batch_size):
            pos = ids[idx][liked[idx]]
            scores = query(pos[:, 0]) @ candidate(pos[:, 1]).t()
            loss = nn.functional.cross_entropy(scores, torch.arange(len(pos)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    ids, liked = liked_pairs(eval_path)
    hits, pairs = 0, 0
    with torch.no_grad():
        for start in range(0, len(ids), batch_size):
            pos = ids[start : start + batch_size][liked[start : start + batch_size]]
            scores = query(pos[:, 0]) @ candidate(pos[:, 1]).t()
            # The recipe's metric: rank among the batch's distinct movies, ties with another movie against
            hits += int(recall_hits(scores, torch.arange(len(pos)), K, candidate_items=pos[:, 1]).sum())
            pairs += len(pos)
    return hits / pairs


def _train_rank(env, config):
    return TrainJob(config, env, progress_bar=False).run().eval_metrics[f"recall@{K}"]


def recipe_config(tmp_path, train_path, eval_path, *overrides):
    base = RunConfig.load(EXAMPLES / "two_tower_movielens.toml")
    return RunConfig.load(
        EXAMPLES / "two_tower_movielens.toml",
        [
            f'data.paths=["{train_path}"]',
            f'data.eval_paths=["{eval_path}"]',
            f"train.epochs={EPOCHS}",
            "train.eval_every=0",
            f"train.eval_batches={EVAL_ROWS // base.train.batch_size + 1}",
            f"train.recall_k={K}",
            f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
            'checkpoint.dir=""',
            *overrides,
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_two_tower_recipe_reaches_the_plain_reference(tmp_path, world_size):
    train_path, eval_path = write_ratings(tmp_path)
    base = RunConfig.load(EXAMPLES / "two_tower_movielens.toml")
    config = recipe_config(tmp_path, train_path, eval_path)
    if world_size == 1:
        recipe_recall = _train_rank(None, config)
    else:
        recalls = run_multiprocess(_train_rank, world_size, config, timeout=400.0)
        assert len(set(recalls)) == 1
        recipe_recall = recalls[0]
    # A rank's batches (training negatives, held-out candidates) hold batch_size rows; so do the reference's
    reference = plain_reference_recall(train_path, eval_path, base.train.batch_size)
    assert recipe_recall >= reference - 0.01, (recipe_recall, reference)


@pytest.mark.slow
def test_ten_times_the_learning_rates_learns_or_stops_with_one_line(tmp_path):
    train_path, eval_path = write_ratings(tmp_path)
    base = RunConfig.load(EXAMPLES / "two_tower_movielens.toml")
    hot = [
        f"optimizer.sparse_lr={10 * base.optimizer.sparse_lr}",
        f"optimizer.dense_lr={10 * base.optimizer.dense_lr}",
    ]
    config = recipe_config(tmp_path, train_path, eval_path, "train.eval_every=10", *hot)
    try:
        recipe_recall = _train_rank(None, config)
    except TrainingDiverged as stopped:
        message = str(stopped)
        assert message.startswith("training diverged at step ") and "\n" not in message
        return
    reference = plain_reference_recall(train_path, eval_path, base.train.batch_size)
    assert recipe_recall >= reference - 0.02, (recipe_recall, reference)
