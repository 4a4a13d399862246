"""The ANN index: chosen by size, its nprobe tuned to the target recall, read back mapped."""

from __future__ import annotations

import numpy as np
import torch

from recserve.recommend import index as index_module
from recserve.recommend.index import (
    KMEANS_ITERATIONS,
    TRAIN_PER_LIST,
    build_index,
    ivf_shape,
    read_index,
    recall,
    search,
    write_index,
)


def test_ivf_reaches_the_target_recall_and_reads_back_mapped(tmp_path):
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(50, 16, generator=g)
    embeddings = centres[torch.randint(0, 50, (6000,), generator=g)] + 0.3 * torch.randn(
        6000, 16, generator=g
    )
    queries = torch.randn(64, 16, generator=g)
    index, choice = build_index(embeddings, queries, kind="ivf", recall_at=20, target_recall=0.95)
    assert (
        choice.type == "ivf" and choice.recall >= 0.95 and choice.params["nprobe"] <= choice.params["nlist"]
    )
    assert choice.params["kmeans_iterations"] == KMEANS_ITERATIONS  # recorded in the manifest
    # Searched by L2 over the embeddings with one column appended (the inner product's order, exactly).
    assert choice.params["mips_to_l2"] is True and index.d == 17
    write_index(index, tmp_path / "index.faiss")
    mapped = read_index(tmp_path / "index.faiss", choice.to_dict())
    exact = torch.topk(queries @ embeddings.T, 20).indices.numpy()
    found = search(mapped, queries, 20)[1].numpy()
    assert recall(found, exact) == choice.recall
    # The fewest lists that reach the target (bisected, not the next power of two): one fewer misses it.
    nprobe = choice.params["nprobe"]
    if nprobe > 1:
        mapped.nprobe = nprobe - 1
        assert recall(search(mapped, queries, 20)[1].numpy(), exact) < 0.95


def test_small_catalogues_search_exactly():
    embeddings = torch.randn(500, 8)
    index, choice = build_index(embeddings, torch.randn(4, 8), recall_at=10)
    assert choice.type == "flat"
    assert recall(np.array([[1, 2, -1]]), np.array([[2, 1, 3]])) == 2 / 3
    assert index.ntotal == 500


def test_exact_search_by_blocks_equals_brute_force(monkeypatch):
    monkeypatch.setattr(index_module, "_ADD_ROWS", 70)  # several blocks, the last one short
    g = torch.Generator().manual_seed(1)
    embeddings, queries = torch.randn(500, 8, generator=g), torch.randn(6, 8, generator=g)
    expected = torch.topk(queries @ embeddings.T, 25).indices
    assert torch.equal(index_module.exact_search(embeddings, queries, 25), expected)


def test_ivf_trains_on_a_sample_of_a_large_catalogue():
    nlist, train_rows = ivf_shape(1_000_000)
    assert nlist == 2000 and train_rows == TRAIN_PER_LIST * nlist == 80_000
    assert 39 <= TRAIN_PER_LIST <= 256  # faiss's range of training vectors per list
    assert ivf_shape(6000) == (150, 40 * 150)  # 2 sqrt(items) lists, each trained on 40 vectors
    assert ivf_shape(100) == (2, 80)  # a tiny one: as many lists as 40-vector samples allow
    assert ivf_shape(50) == (1, 40)


def test_the_augmented_l2_order_is_the_inner_product_order():
    # Every list probed: the L2 search over [x, sqrt(R^2 - |x|^2)] with the query's column 0 finds exactly
    # the items of the largest inner product, in that order (embeddings of unequal norms).
    g = torch.Generator().manual_seed(2)
    embeddings = torch.randn(3000, 8, generator=g) * torch.rand(3000, 1, generator=g) * 3
    queries = torch.randn(16, 8, generator=g)
    index, choice = build_index(embeddings, queries, kind="ivf", recall_at=10, target_recall=1.0)
    index.nprobe = choice.params["nlist"]
    expected = torch.topk(queries @ embeddings.T, 10).indices
    assert torch.equal(search(index, queries, 10)[1], expected)


def test_an_inner_product_index_of_an_older_package_still_reads(tmp_path):
    import faiss

    old = faiss.IndexIVFFlat(faiss.IndexFlatIP(8), 8, 4, faiss.METRIC_INNER_PRODUCT)
    data = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    old.train(data)
    old.add(data)
    write_index(old, tmp_path / "old.faiss")
    entry = {"type": "ivf", "params": {"nlist": 4, "nprobe": 4}}
    mapped = read_index(tmp_path / "old.faiss", entry)
    expected = torch.topk(torch.from_numpy(data[:3]) @ torch.from_numpy(data).T, 5).indices
    assert torch.equal(search(mapped, torch.from_numpy(data[:3]), 5)[1], expected)
