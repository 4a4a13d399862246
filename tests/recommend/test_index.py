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
    assert nlist == 1000 and train_rows == TRAIN_PER_LIST * nlist == 64_000
    assert 39 <= TRAIN_PER_LIST <= 256  # faiss's range of training vectors per list
    assert ivf_shape(6000) == (77, 64 * 77)
    assert ivf_shape(100) == (1, 64)  # a tiny one: one list
