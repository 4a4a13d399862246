"""Synthetic data: shapes, determinism across workers, rank differences, Zipf skew, learnable labels."""

import pytest
import torch
from torch.utils.data import DataLoader

from rectrain.datasets import SyntheticConfig, SyntheticDataset, build_dataset
from rectrain.datasets.synthetic import hidden_score
from rectrain.metrics import auc


def _flat(batch) -> tuple[list, list, list, list]:
    kjt = batch.sparse_features
    return (
        batch.dense_features.tolist(),
        kjt.values().tolist(),
        kjt.lengths().tolist(),
        batch.labels.tolist(),
    )


def test_criteo_shape():
    cfg = SyntheticConfig.criteo(batch_size=16, num_batches=2, num_embeddings=50)
    batches = list(SyntheticDataset(cfg))
    assert len(batches) == 2
    b = batches[0]
    assert b.dense_features.shape == (16, 13) and b.labels.shape == (16,)
    assert b.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    assert b.sparse_features.lengths().tolist() == [1] * (26 * 16)
    assert int(b.sparse_features.values().min()) >= 0 and int(b.sparse_features.values().max()) < 50


def test_standard_workload_shape_and_per_table_rows():
    rows = [10, 20, 30, 40, 50, 60, 70, 80]
    cfg = SyntheticConfig.standard_workload(batch_size=32, num_batches=1, num_embeddings=rows)
    kjt = next(iter(SyntheticDataset(cfg))).sparse_features
    lengths = kjt.lengths()
    assert len(kjt.keys()) == 8 and int(lengths.min()) >= 1 and int(lengths.max()) <= 39
    for name, r in zip(kjt.keys(), rows):
        assert int(kjt[name].values().max()) < r


def test_same_batches_whatever_the_number_of_workers_and_distinct_per_rank():
    cfg = SyntheticConfig.standard_workload(batch_size=8, num_batches=5, seed=3)
    single = [_flat(b) for b in SyntheticDataset(cfg)]
    loader = DataLoader(build_dataset(cfg, rank=0, world_size=2), batch_size=None, num_workers=2)
    from_workers = [_flat(b) for b in loader]
    assert sorted(map(str, from_workers)) == sorted(map(str, single))
    other_rank = [_flat(b) for b in SyntheticDataset(cfg, rank=1, world_size=2)]
    assert other_rank[0] != single[0]
    assert [
        _flat(b) for b in SyntheticDataset(SyntheticConfig.standard_workload(**{**vars(cfg), "seed": 4}))
    ][0] != single[0]


def test_zipf_concentrates_ids():
    cfg = SyntheticConfig.criteo(batch_size=2000, num_batches=1, num_embeddings=10_000, distribution="zipf")
    ids = next(iter(SyntheticDataset(cfg))).sparse_features["cat_0"].values()
    _, counts = torch.unique(ids, return_counts=True)
    top10 = counts.sort(descending=True).values[:10].sum().item()
    assert top10 > 0.2 * ids.numel()  # uniform would put ~0.2% of ids in the top 10
    assert int(ids.max()) < 10_000


def test_hidden_scores_are_fixed_and_spread():
    ids = torch.arange(10_000)
    s = hidden_score(ids, 0, 0)
    assert torch.equal(s, hidden_score(ids, 0, 0)) and not torch.equal(s, hidden_score(ids, 1, 0))
    assert float(s.min()) >= -1.0 and float(s.max()) < 1.0 and abs(float(s.mean())) < 0.05


def test_labels_are_learnable():
    """A per-id logistic model (EmbeddingBag + linear) trained briefly beats chance on held-out batches."""
    torch.manual_seed(0)
    cfg = SyntheticConfig.criteo(batch_size=512, num_batches=40, num_sparse=4, num_embeddings=50, signal=4.0)
    ds = SyntheticDataset(cfg)
    bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(50, 1, mode="mean") for _ in range(4))
    dense = torch.nn.Linear(13, 1)
    opt = torch.optim.Adam([*bags.parameters(), *dense.parameters()], lr=0.05)

    def logits(batch):
        kjt = batch.sparse_features
        out = dense(batch.dense_features).squeeze(1)
        for name, bag in zip(kjt.keys(), bags):
            jt = kjt[name]
            out = out + bag(jt.values(), jt.offsets()[:-1]).squeeze(1)
        return out

    for i in range(30):
        batch = ds.batch(i)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        held_out = [ds.batch(i) for i in range(30, 40)]
        scores = torch.cat([logits(b) for b in held_out])
        labels = torch.cat([b.labels for b in held_out])
    assert auc(scores, labels) > 0.7


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="distribution"):
        SyntheticConfig(distribution="normal")
    with pytest.raises(ValueError, match="ids_per_feature"):
        SyntheticConfig(ids_per_feature=(3, 1))
    with pytest.raises(ValueError, match="num_embeddings"):
        SyntheticConfig(num_sparse=2, num_embeddings=[1, 2, 3]).table_rows()
