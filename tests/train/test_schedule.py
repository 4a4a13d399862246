"""Learning-rate warm-up and decay for the dense and the fused sparse optimizers; dense gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rectrain.errors import ConfigError
from rectrain.train.job import TrainJob
from rectrain.train.schedule import LRSchedule
from tests.train.test_job import synthetic


def test_warmup_then_polynomial_decay_hits_its_endpoints():
    s = LRSchedule(warmup_steps=4, decay="polynomial", decay_start=6, decay_steps=10, decay_power=2.0)
    assert [s.factor(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.factor(5) == 1.0 and s.factor(6) == 1.0
    assert s.factor(11) == pytest.approx(0.25) and s.factor(16) == 0.0 and s.factor(100) == 0.0


@given(
    warmup=st.integers(0, 20),
    steps=st.integers(1, 50),
    decay=st.sampled_from(["constant", "linear", "polynomial", "cosine"]),
    floor=st.floats(0.0, 0.5),
)
def test_the_factor_rises_during_warmup_then_never_rises(warmup, steps, decay, floor):
    s = LRSchedule(
        warmup_steps=warmup, decay=decay, decay_start=warmup, decay_steps=steps, min_lr_ratio=floor
    )
    factors = [s.factor(i) for i in range(warmup + steps + 5)]
    assert all(a <= b for a, b in zip(factors[:warmup], factors[1 : warmup + 1]))
    assert all(b <= a + 1e-12 for a, b in zip(factors[warmup:], factors[warmup + 1 :]))
    expected_end = 1.0 if decay == "constant" else floor
    assert math.isclose(factors[-1], expected_end, abs_tol=1e-9)


def test_a_run_applies_the_schedule_to_dense_and_sparse_rates(tmp_path):
    config = synthetic(
        tmp_path,
        "train.steps=8",
        "optimizer.warmup_steps=3",
        "optimizer.decay=cosine",
        "optimizer.dense_lr=0.2",
        "optimizer.sparse_lr=0.1",
    )
    job = TrainJob(config, progress_bar=False)
    seen: list[list[float]] = []
    job.training.optimizer.register_step_pre_hook(
        lambda opt, *_: seen.append([g["lr"] for g in opt.param_groups])
    )
    job.run()
    schedule = config.lr_schedule()
    assert len(seen) == 8
    for step, rates in enumerate(seen):
        factor = schedule.factor(step)
        assert rates == pytest.approx([0.2 * factor] * (len(rates) - 1) + [0.1 * factor])
    assert seen[2][0] == pytest.approx(0.2) and seen[-1][0] < 0.2 * 0.1


def test_dense_gradients_are_clipped_to_max_grad_norm(tmp_path):
    job = TrainJob(synthetic(tmp_path, "train.steps=3", "optimizer.max_grad_norm=1e-3"), progress_bar=False)
    dense = job.training.optimizer.param_groups[0]["params"]
    norms: list[float] = []
    job.training.optimizer.register_step_post_hook(  # after the step: grads as the optimizer used them
        lambda *_: norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in dense])))
    )
    job.run()
    assert len(norms) == 3 and all(n <= 1e-3 * 1.0001 for n in norms)


def test_a_decay_needs_a_length(tmp_path):
    with pytest.raises(ConfigError, match="optimizer.decay_steps: needed with decay = 'cosine'"):
        synthetic(tmp_path, "train.epochs=1", "optimizer.decay=cosine")
    with pytest.raises(ConfigError, match="optimizer.decay: expected one of 'constant'"):
        synthetic(tmp_path, "optimizer.decay=exponential")
