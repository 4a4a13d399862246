"""Embedding towers run unsharded as their two modules in sequence; TorchRec's test models run forward."""

from __future__ import annotations

import torch

from rectrain.distributed.test_utils.test_model import (
    ModelInput,
    TestSparseNN,
    TestTowerCollectionSparseNN,
)
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.sparse import KeyedJaggedTensor

TABLES = [
    EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name=f"t{i}", feature_names=[f"f{i}"])
    for i in range(4)
]
WEIGHTED = [EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="w0", feature_names=["wf0"])]


def _input(batch: int = 3) -> ModelInput:
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(4)],
        values=torch.arange(4 * batch) % 10,
        lengths=torch.ones(4 * batch, dtype=torch.long),
    )
    weighted = KeyedJaggedTensor.from_lengths_sync(
        keys=["wf0"],
        values=torch.arange(batch),
        lengths=torch.ones(batch, dtype=torch.long),
        weights=torch.ones(batch),
    )
    return ModelInput(torch.rand(batch, 10), features, weighted, torch.rand(batch))


def test_tower_collection_concatenates_its_towers_interactions():
    model = TestTowerCollectionSparseNN(tables=TABLES, weighted_tables=WEIGHTED).eval()
    batch = _input()
    out = model.tower_arch(batch.idlist_features, batch.idscore_features)
    assert out.shape == (3, 8 + 4 + 4)  # towers of (t0, t2), (t1), (w0)
    tower = model.tower_arch.towers[1]
    expected = tower.interaction(tower.embedding(batch.idlist_features))
    torch.testing.assert_close(out[:, 8:12], expected)
    assert model(batch).shape == (3,)


def test_sparse_nn_trains_one_step():
    model = TestSparseNN(tables=TABLES, weighted_tables=WEIGHTED)
    loss, pred = model(_input())
    loss.backward()
    assert pred.shape == (3,) and model.over.dhn_arch[0].weight.grad is not None
