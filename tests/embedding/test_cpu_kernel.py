"""The compiled CPU fused backward (rectrain.embedding.cpu_kernel) against FBGEMM's backward and the torch-ops
sparse Adam, on random TBE inputs: repeated ids, empty bags, weighted bags, MEAN pooling, tables of different
dims, one table split into row parts over threads, and large sparse tables (the sorted rather than the
scanned row order).

Tolerance: fp32 on both sides; only the order in which repeated ids' gradients are summed differs, so
weights and state agree to rtol 1e-5, atol 1e-6. Between thread counts the kernel is bitwise identical.
"""

from __future__ import annotations

import logging

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectrain.embedding import backward_choice, native_backward
from rectrain.embedding.config import EmbeddingBagConfig, EmbOptimType, FusedOptimizerConfig, PoolingType
from rectrain.embedding.cpu_backward_runner import CompiledBackward, compiled_ready, split_tasks
from rectrain.embedding.table_batch import FusedTableBatch
from rectrain.embedding.tbe_layout import TBELayout
from rectrain.errors import ConfigError
from tests.embedding.test_native_backward import assert_same, build, make_batch, make_tables

pytestmark = pytest.mark.skipif(not compiled_ready(), reason="numba kernel unavailable here")
CPU = torch.device("cpu")


def width_of(tables: list[EmbeddingBagConfig]) -> int:
    return sum(t.embedding_dim * len(t.feature_names) for t in tables)


def run_steps(batches, tables, dims_total, weighted, *kernels, steps=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        values, offsets, weights = make_batch(gen, tables, batch=batches, weighted=weighted)
        grad = torch.randn(batches, dims_total, generator=gen)
        for kernel in kernels:
            kernel(values, offsets, weights).backward(grad)


@pytest.mark.parametrize(("pooling", "weighted"), [(PoolingMode.SUM, True), (PoolingMode.MEAN, False)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_matches_torch_ops_sparse_adam(pooling, weighted, weight_decay) -> None:
    tables = make_tables((8, 4, 12))
    config = FusedOptimizerConfig("adam", lr=0.1, weight_decay=weight_decay)
    ours, theirs = (FusedTableBatch(tables, pooling, config, CPU) for _ in range(2))
    assert ours._cpu_adam._compiled is not None
    theirs._cpu_adam._compiled = None  # the torch-ops SparseAdam path
    for batch in (ours, theirs):
        torch.manual_seed(1)
        with torch.no_grad():
            for weight in batch.table_weights():
                weight.uniform_(-0.5, 0.5)
    run_steps(6, tables, width_of(tables), weighted, ours, theirs, steps=4)
    assert_same(ours, theirs)
    assert torch.equal(ours._cpu_adam.state.step, theirs._cpu_adam.state.step)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_row_parts_over_threads_match_fbgemm_and_are_thread_count_independent(optimizer) -> None:
    """One table, two threads: its rows are split into parts (row % parts); results equal one thread's
    bitwise and FBGEMM's within tolerance."""
    tables = [EmbeddingBagConfig(name="t", num_embeddings=50, embedding_dim=8, feature_names=["a", "b"])]
    one, two = (build(tables, optimizer, PoolingMode.SUM, "native", 0.0) for _ in range(2))
    fbgemm = build(tables, optimizer, PoolingMode.SUM, "fbgemm", 0.0)
    threads = torch.get_num_threads()
    try:
        for seed in range(3):
            torch.set_num_threads(1)
            run_steps(8, tables, 16, True, one, fbgemm, steps=1, seed=seed)
            torch.set_num_threads(2)
            run_steps(8, tables, 16, True, two, steps=1, seed=seed)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one.table_weights(), two.table_weights()):
        assert torch.equal(a, b)
    assert_same(two, fbgemm)


def test_large_sparse_table_takes_the_sorted_order_and_matches_fbgemm() -> None:
    """Far more rows than ids: rows are radix-sorted instead of scanned (cpu_kernel._order_rows)."""
    tables = [
        EmbeddingBagConfig(name="big", num_embeddings=300_000, embedding_dim=4, feature_names=["f"]),
        EmbeddingBagConfig(name="small", num_embeddings=7, embedding_dim=8, feature_names=["g"]),
    ]
    ours = build(tables, "rowwise_adagrad", PoolingMode.SUM, "native", 0.0)
    theirs = build(tables, "rowwise_adagrad", PoolingMode.SUM, "fbgemm", 0.0)
    gen = torch.Generator().manual_seed(4)
    for _ in range(2):
        lengths = torch.randint(0, 5, (2, 16), generator=gen)
        ids = [torch.randint(0, 300_000, (int(lengths[0].sum()),), generator=gen)]
        ids[0][1::3] = ids[0][0]  # repeats far apart in the big table
        ids.append(torch.randint(0, 7, (int(lengths[1].sum()),), generator=gen))
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
        grad = torch.randn(16, 12, generator=gen)
        for kernel in (ours, theirs):
            kernel(torch.cat(ids), offsets).backward(grad)
    assert_same(ours, theirs)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dims=st.lists(st.sampled_from([4, 8, 12]), min_size=1, max_size=3),
    optimizer=st.sampled_from(["sgd", "adagrad", "rowwise_adagrad"]),
    pooling=st.sampled_from([PoolingMode.SUM, PoolingMode.MEAN]),
    weighted=st.booleans(),
    batch=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_property_matches_fbgemm(dims, optimizer, pooling, weighted, batch, seed) -> None:
    """Weighted MEAN is checked against FBGEMM's weighted SUM with weights divided by the bag length: the
    same forward, and the true gradient (FBGEMM's own weighted-MEAN backward drops the 1/length)."""
    tables = make_tables(tuple([8, *dims]))
    ours = build(tables, optimizer, pooling, "native", 0.0)
    mean_as_sum = weighted and pooling is PoolingMode.MEAN
    theirs = build(tables, optimizer, PoolingMode.SUM if mean_as_sum else pooling, "fbgemm", 0.0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        values, offsets, weights = make_batch(gen, tables, batch=batch, weighted=weighted)
        grad = torch.randn(batch, width_of(tables), generator=gen)
        ours(values, offsets, weights).backward(grad)
        if mean_as_sum:
            lengths = offsets.diff()
            weights = weights / torch.repeat_interleave(lengths.clamp(min=1), lengths).float()
        theirs(values, offsets, weights).backward(grad)
    assert_same(ours, theirs)


def test_out_of_range_id_raises_and_leaves_scratch_clean() -> None:
    layout = TBELayout.from_tables([5, 6], [4, 4])
    backward = CompiledBackward(layout, EmbOptimType.SGD, PoolingType.SUM, [0, 0])
    weights, grad = torch.zeros(44), torch.ones(1, 8)
    offsets = torch.tensor([0, 2, 4])
    with pytest.raises(ValueError, match="id 6 at position 3 is out of range"):
        backward.run((grad, torch.tensor([1, 2, 0, 6]), offsets, None), weights, [], (1.0, 0.0, 0, 0, 0))
    assert not backward._counts.any()
    weights.zero_()
    backward.run((grad, torch.tensor([1, 1, 0, 5]), offsets, None), weights, [], (1.0, 0.0, 0, 0, 0))
    assert torch.equal(weights[4:8], torch.full((4,), -2.0)) and torch.equal(weights[40:44], -torch.ones(4))


def test_split_tasks_balances_by_ids_and_splits_few_tables() -> None:
    parts, tasks = split_tasks([100, 10, 0, 90, 40, 30], workers=2)  # largest first, to the least loaded
    assert parts == 1 and [w.tolist() for w in tasks] == [[0, 5, 1], [3, 4]]
    parts, tasks = split_tasks([100, 0, 90], workers=2)  # fewer tables than 2 per worker: row parts
    assert parts == 2 and [w.tolist() for w in tasks] == [[0, 4], [1, 5]]
    parts, tasks = split_tasks([50], workers=2)
    assert parts == 4 and sorted(t for w in tasks for t in w.tolist()) == [0, 1, 2, 3]
    parts, tasks = split_tasks([50, 7], workers=1)
    assert parts == 1 and [w.tolist() for w in tasks] == [[0, 1]]


@pytest.mark.parametrize("instructions", ["", "AVX2"])
def test_auto_picks_the_compiled_kernel_whatever_the_isa_and_logs_once(
    monkeypatch, caplog, instructions
) -> None:
    """Issue 34: the compiled kernel was faster or within 5 % on every CPU class measured (AVX-512 too)."""
    monkeypatch.delenv(backward_choice.ENV_VAR, raising=False)
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", instructions)
    backward_choice.log_choice.cache_clear()
    tables = make_tables((8, 8, 8))
    with caplog.at_level(logging.INFO, logger="rectrain.embedding.backward_choice"):
        batches = [build(tables, "rowwise_adagrad", PoolingMode.SUM, "auto", 0.0) for _ in range(2)]
    assert all(batch._native is not None for batch in batches)
    lines = [r.getMessage() for r in caplog.records if "CPU fused embedding backward" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("CPU fused embedding backward: native (auto: the compiled")


def test_auto_keeps_fbgemm_without_the_compiled_kernel_and_obeys_the_override(monkeypatch) -> None:
    monkeypatch.delenv(backward_choice.ENV_VAR, raising=False)
    assert backward_choice.auto_choice().kernel == "native"
    monkeypatch.setattr(backward_choice, "compiled_ready", lambda: False)
    choice = backward_choice.auto_choice()
    assert choice.kernel == "fbgemm" and "cannot run here" in choice.reason
    monkeypatch.setenv(backward_choice.ENV_VAR, "native")
    assert backward_choice.auto_choice() == backward_choice.BackwardChoice(
        "native", "RECTRAIN_CPU_BACKWARD=native"
    )
    monkeypatch.setenv(backward_choice.ENV_VAR, "fast")
    with pytest.raises(ConfigError, match="RECTRAIN_CPU_BACKWARD"):
        backward_choice.auto_choice()


def test_choice_for_the_optimizer_and_device_at_hand(monkeypatch) -> None:
    monkeypatch.delenv(backward_choice.ENV_VAR, raising=False)
    choose = backward_choice.cpu_backward_choice
    assert choose(FusedOptimizerConfig("sgd"), CPU).kernel == "native"
    assert choose(FusedOptimizerConfig("sgd", cpu_backward="fbgemm"), CPU).reason == (
        "cpu_backward='fbgemm' in the config"
    )
    assert (
        choose(FusedOptimizerConfig("adagrad", weight_decay=0.1, cpu_backward="native"), CPU).kernel
        == "fbgemm"
    )
    assert choose(FusedOptimizerConfig("adam", cpu_backward="fbgemm"), CPU).kernel == "native"
    assert choose(FusedOptimizerConfig("sgd"), torch.device("cuda")).kernel == "fbgemm"
    agreed = backward_choice.BackwardChoice("fbgemm", "rank 0's choice")
    assert choose(FusedOptimizerConfig("sgd"), CPU, agreed) is agreed
    assert backward_choice.resolved(FusedOptimizerConfig("sgd"), agreed).cpu_backward == "fbgemm"


def test_forced_native_without_numba_runs_the_torch_ops_form(monkeypatch) -> None:
    from rectrain.embedding import cpu_adam

    monkeypatch.setattr(native_backward, "compiled_ready", lambda: False)
    monkeypatch.setattr(cpu_adam, "compiled_ready", lambda: False)
    tables = make_tables((8, 4, 12))
    ours = build(tables, "rowwise_adagrad", PoolingMode.MEAN, "native", 0.0)
    assert ours._native is not None and ours._native._compiled is None
    theirs = build(tables, "rowwise_adagrad", PoolingMode.MEAN, "fbgemm", 0.0)
    run_steps(6, tables, width_of(tables), False, ours, theirs)
    assert_same(ours, theirs)
