"""The native CPU fused backward against FBGEMM's, step by step on the same TBE inputs.

Tolerance: both are fp32; they differ only in the order repeated ids' gradients are summed (and FBGEMM's
vectorised reductions), so weights and state agree to ~1e-6 (asserted with rtol=1e-5, atol=1e-6).
"""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.embedding.table_batch import FusedTableBatch
from rectrain.errors import ConfigError

RTOL, ATOL = 1e-5, 1e-6
CPU = torch.device("cpu")


def make_tables(dims: tuple[int, ...]) -> list[EmbeddingBagConfig]:
    # Table 0 serves two features, so one table is read from two column blocks of the output.
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=13 + 7 * i, embedding_dim=d, feature_names=[f"f{i}"])
        for i, d in enumerate(dims)
    ]
    tables[0] = EmbeddingBagConfig(
        name="t0", num_embeddings=13, embedding_dim=dims[0], feature_names=["f0", "g0"]
    )
    return tables


def make_batch(gen: torch.Generator, tables: list[EmbeddingBagConfig], batch: int, weighted: bool):
    """Random bags with empty ones and many repeated ids (small tables)."""
    rows = [t.num_embeddings for t in tables for _ in t.feature_names]
    lengths = torch.randint(0, 6, (len(rows), batch), generator=gen)
    lengths[:, 0] = 0  # an empty bag in every feature
    ids = [torch.randint(0, r, (int(n.sum()),), generator=gen) for r, n in zip(rows, lengths)]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    values = torch.cat(ids)
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    return values, offsets, weights


def build(tables, optimizer: str, pooling: PoolingMode, kernel: str, wd: float) -> FusedTableBatch:
    config = FusedOptimizerConfig(optimizer, lr=0.1, weight_decay=wd, cpu_backward=kernel)
    batch = FusedTableBatch(tables, pooling, config, CPU)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in batch.table_weights():
            weight.uniform_(-0.5, 0.5)
    return batch


def assert_same(ours: FusedTableBatch, theirs: FusedTableBatch) -> None:
    for a, b in zip(ours.table_weights(), theirs.table_weights()):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    for a, b in zip(ours.table_optimizer_states(), theirs.table_optimizer_states()):
        for name in b:
            torch.testing.assert_close(a[name], b[name], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize(
    ("dims", "pooling", "weighted", "wd"),
    [
        ((8, 8, 8), PoolingMode.SUM, False, 0.0),
        ((8, 8, 8), PoolingMode.MEAN, True, 0.01),
        ((8, 4, 12), PoolingMode.SUM, True, 0.0),
        ((8, 4, 12), PoolingMode.MEAN, False, 0.01),
    ],
)
def test_native_matches_fbgemm(optimizer, dims, pooling, weighted, wd) -> None:
    tables = make_tables(dims)
    ours = build(tables, optimizer, pooling, "native", wd)
    theirs = build(tables, optimizer, pooling, "fbgemm", wd)
    # Weight decay stays on FBGEMM (its CPU kernels' own variant), so both must still agree.
    assert (ours._native is not None) == (wd == 0) and theirs._native is None
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        values, offsets, weights = make_batch(gen, tables, batch=6, weighted=weighted)
        grad = torch.randn(6, sum(t.embedding_dim * len(t.feature_names) for t in tables), generator=gen)
        for kernel in (ours, theirs):
            kernel(values, offsets, weights).backward(grad)
        assert_same(ours, theirs)


def test_resume_across_kernels_is_exact_continuation() -> None:
    """State written by one kernel, loaded into the other, continues like the first kernel would.

    Both kernels keep weights and momentum in the same FBGEMM buffers, so a checkpoint is just those tensors;
    the continuation equals the original run within the float tolerance above (summation order only).
    """
    tables = make_tables((8, 8, 8))
    first = build(tables, "rowwise_adagrad", PoolingMode.SUM, "fbgemm", 0.0)
    gen = torch.Generator().manual_seed(3)
    batches = [make_batch(gen, tables, 6, False) for _ in range(4)]
    grads = [torch.randn(6, 32, generator=gen) for _ in batches]
    for (values, offsets, _), grad in zip(batches[:2], grads):
        first(values, offsets).backward(grad)
    resumed = build(tables, "rowwise_adagrad", PoolingMode.SUM, "native", 0.0)
    with torch.no_grad():
        for dst, src in zip(resumed.table_weights(), first.table_weights()):
            dst.copy_(src)
        for dst, src in zip(resumed.table_optimizer_states(), first.table_optimizer_states()):
            dst["momentum1"].copy_(src["momentum1"])
    for (values, offsets, _), grad in zip(batches[2:], grads[2:]):
        first(values, offsets).backward(grad)
        resumed(values, offsets).backward(grad)
    assert_same(resumed, first)


def test_bad_switch_names_the_field() -> None:
    with pytest.raises(ConfigError, match="cpu_backward"):
        FusedOptimizerConfig("sgd", cpu_backward="fast")


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_sequence_lookup_matches_fbgemm(optimizer) -> None:
    """Unpooled (EmbeddingCollection) lookups: one gradient row per id."""
    tables = make_tables((8, 8, 8))
    ours = build(tables, optimizer, PoolingMode.NONE, "native", 0.0)
    theirs = build(tables, optimizer, PoolingMode.NONE, "fbgemm", 0.0)
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        values, offsets, _ = make_batch(gen, tables, batch=5, weighted=False)
        grad = torch.randn(values.numel(), 8, generator=gen)
        for kernel in (ours, theirs):
            kernel(values, offsets).backward(grad)
        assert_same(ours, theirs)
