"""``WindowedMetrics``: AUC and NE of the latest examples, the same numbers as the whole-tensor formulas."""

from __future__ import annotations

import math

import pytest
import torch

from rectrain.metrics import WindowedMetrics
from rectrain.metrics.functional import auc, normalized_entropy
from tests.distributed.multiprocess import run_multiprocess


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=g) < 0.3).float()
    predictions = (0.3 * labels + 0.7 * torch.rand(n, generator=g)).clamp(0, 1)
    return predictions, labels


def test_the_window_holds_the_latest_examples_only():
    p, y = _data(1000, 0)
    window = WindowedMetrics(300, batch_size=50)
    for lo in range(0, 1000, 50):
        window.update(p[lo : lo + 50], y[lo : lo + 50])
    got = window.compute()
    assert got["num_examples"] == 300
    assert got["auc"] == pytest.approx(auc(p[-300:], y[-300:]), abs=1e-6)
    assert got["ne"] == pytest.approx(normalized_entropy(p[-300:], y[-300:]), rel=1e-6)
    assert math.isnan(WindowedMetrics(5).compute()["auc"])


def test_auc_keeps_the_latest_examples_and_ne_the_latest_whole_batches():
    # TorchRec's windows: AUC trims to the window exactly, sums drop whole batches (64 does not divide 300)
    p, y = _data(1000, 2)
    window = WindowedMetrics(300, batch_size=64)
    for lo in range(0, 1000, 64):
        window.update(p[lo : lo + 64], y[lo : lo + 64])
    got = window.compute()
    assert got["auc"] == pytest.approx(auc(p[-300:], y[-300:]), abs=1e-6)
    assert got["num_examples"] == 1000 - 704  # the batches starting at 704, 768, ..., 960 (the last has 40)
    assert got["ne"] == pytest.approx(normalized_entropy(p[704:], y[704:]), rel=1e-6)
    with pytest.raises(ValueError, match="Local window size must be larger than batch size"):
        WindowedMetrics(300, batch_size=301)


def _rank_window(env, window: int) -> dict[str, float]:
    p, y = _data(200, 1)
    metrics = WindowedMetrics(window, world_size=2, batch_size=20)
    for lo in range(env.rank * 100, (env.rank + 1) * 100, 20):
        metrics.update(p[lo : lo + 20], y[lo : lo + 20])
    return metrics.compute()


def test_ranks_compute_over_the_union_of_their_windows():
    p, y = _data(200, 1)
    keep = torch.cat([torch.arange(60, 100), torch.arange(160, 200)])  # each rank's latest 40
    results = run_multiprocess(_rank_window, 2, 80)
    assert results[0] == results[1]
    assert results[0]["num_examples"] == 80
    assert results[0]["auc"] == pytest.approx(auc(p[keep], y[keep]), abs=1e-6)
    assert results[0]["ne"] == pytest.approx(normalized_entropy(p[keep], y[keep]), rel=1e-6)
