"""Sparse weight decay on CPU: FBGEMM's CPU SGD/Adagrad/row-wise Adagrad ignore it, and rectrain says so.

``optimizer.sparse_weight_decay`` reaches the TBE (tests/train/test_config.py), but fbgemm-gpu-cpu's CPU
updates are bit-identical with and without it, so a run asking for it trains without it. These tests pin
both facts: if a future FBGEMM applies it on CPU, the first test fails and the warning should go.
"""

from __future__ import annotations

import logging

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.embedding.table_batch import FusedTableBatch

CPU = torch.device("cpu")
TABLES = [EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=20, feature_names=["f0"])]


def trained_weights(optimizer: str, weight_decay: float) -> torch.Tensor:
    config = FusedOptimizerConfig(optimizer, lr=0.1, weight_decay=weight_decay, cpu_backward="fbgemm")
    batch = FusedTableBatch(TABLES, PoolingMode.SUM, config, CPU)
    with torch.no_grad():
        batch.table_weights()[0].copy_(torch.linspace(-1, 1, 160).reshape(20, 8))
    indices, offsets = torch.tensor([1, 2, 2, 5]), torch.tensor([0, 2, 4])
    for _ in range(3):
        out = batch(indices, offsets)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return batch.table_weights()[0].detach().clone()


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_fbgemm_cpu_updates_ignore_weight_decay(optimizer: str) -> None:
    plain, decayed = trained_weights(optimizer, 0.0), trained_weights(optimizer, 0.5)
    assert not torch.equal(plain, torch.linspace(-1, 1, 160).reshape(20, 8))  # the rows did train
    assert torch.equal(plain, decayed)


def test_weight_decay_on_cpu_logs_that_it_is_not_applied(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rectrain.embedding.table_batch"):
        decayed = FusedOptimizerConfig("rowwise_adagrad", weight_decay=0.01)
        FusedTableBatch(TABLES, PoolingMode.SUM, decayed, CPU)
    assert "weight decay 0.01 is not applied" in caplog.text and "t0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rectrain.embedding.table_batch"):
        FusedTableBatch(TABLES, PoolingMode.SUM, FusedOptimizerConfig("adam", weight_decay=0.01), CPU)
        FusedTableBatch(TABLES, PoolingMode.SUM, FusedOptimizerConfig("rowwise_adagrad"), CPU)
    assert "not applied" not in caplog.text
