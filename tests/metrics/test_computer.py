"""MetricsComputer: batches accumulate to the whole-set metrics, windows bound AUC, ranks aggregate."""

import math

import pytest
import torch

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.metrics import MetricsComputer, auc, calibration, log_loss, normalized_entropy
from tests.distributed.multiprocess import run_multiprocess


def _data(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.bernoulli(torch.full((n,), 0.3), generator=gen)
    predictions = torch.sigmoid(2 * labels - 1 + torch.randn(n, generator=gen))
    return predictions, labels


def test_batches_accumulate_to_the_metrics_of_the_whole_set():
    p, y = _data()
    m = MetricsComputer()
    for chunk in range(0, len(p), 64):
        m.update(p[chunk : chunk + 64], y[chunk : chunk + 64])
    got = m.compute()
    assert got["num_examples"] == len(p)
    assert got["auc"] == pytest.approx(auc(p, y), abs=1e-6)
    assert got["log_loss"] == pytest.approx(log_loss(p, y))
    assert got["ne"] == pytest.approx(normalized_entropy(p, y))
    assert got["calibration"] == pytest.approx(calibration(p, y))
    assert 0.5 < got["auc"] < 1.0


def test_auc_window_keeps_only_the_latest_examples():
    p, y = _data(300)
    m = MetricsComputer(auc_window=50)
    for chunk in range(0, 300, 30):
        m.update(p[chunk : chunk + 30], y[chunk : chunk + 30])
    got = m.compute()
    assert got["auc"] == pytest.approx(auc(p[-50:], y[-50:]), abs=1e-6)
    assert got["log_loss"] == pytest.approx(log_loss(p, y))  # sums still cover everything
    assert m.stored_examples == 50  # bounded: the window only


def test_reset_and_empty():
    m = MetricsComputer()
    m.update(torch.tensor([0.2]), torch.tensor([1.0]))
    m.reset()
    got = m.compute()
    assert got["num_examples"] == 0 and math.isnan(got["auc"]) and math.isnan(got["log_loss"])
    with pytest.raises(ValueError, match="auc_window"):
        MetricsComputer(auc_window=0)


def _metrics_on_rank(env: ShardingEnv, p: torch.Tensor, y: torch.Tensor) -> dict:
    m = MetricsComputer()
    # Uneven shares: rank 0 gets the first 150 examples, rank 1 the remaining 250.
    mine = slice(0, 150) if env.rank == 0 else slice(150, None)
    m.update(p[mine], y[mine])
    only_rank_zero = MetricsComputer()
    if env.rank == 0:
        only_rank_zero.update(p, y)
    return m.compute(env.pg), only_rank_zero.compute()


def test_two_ranks_compute_metrics_of_the_union():
    p, y = _data(400, seed=1)
    results = run_multiprocess(_metrics_on_rank, 2, p, y)
    single = MetricsComputer()
    single.update(p, y)
    expected = single.compute()
    per_rank_mean = (auc(p[:150], y[:150]) + auc(p[150:], y[150:])) / 2
    for got, got_one_sided in results:
        assert got_one_sided == expected  # a rank without examples contributes nothing
        assert got["num_examples"] == 400
        assert got["auc"] == pytest.approx(expected["auc"], abs=1e-9)
        for name in ("ne", "log_loss", "accuracy", "calibration"):
            assert got[name] == pytest.approx(expected[name], rel=1e-9)
    assert results[0][0] == results[1][0]
    assert per_rank_mean != pytest.approx(expected["auc"], abs=1e-9)
