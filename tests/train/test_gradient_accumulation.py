"""Gradient accumulation steps the optimizer once per ``num_steps`` micro-batches, on their summed gradient,
and flushes what has accumulated when the data ends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rectrain.train.gradient_accumulation import GradientAccumulationConfig, GradientAccumulationWrapper
from rectrain.train.pipeline import TrainPipeline


class _Pipeline(TrainPipeline[torch.Tensor, torch.Tensor]):
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def progress(self, dataloader_iter):
        loss = self.model(next(dataloader_iter)).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss


def test_accumulated_steps_equal_one_step_on_the_summed_gradient():
    torch.manual_seed(0)
    batches = [torch.randn(4, 3) for _ in range(5)]
    model, reference = nn.Linear(3, 1), nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = GradientAccumulationWrapper(
        _Pipeline(model, optimizer), optimizer, model, GradientAccumulationConfig(num_steps=2)
    )
    data = iter(batches)
    with pytest.raises(StopIteration):
        while True:
            wrapped.progress(data)
    # Reference: steps on batches 0+1 and 2+3, then the flush of batch 4 alone.
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for group in (batches[0:2], batches[2:4], batches[4:5]):
        ref_optimizer.zero_grad()
        sum(reference(b).sum() for b in group).backward()
        ref_optimizer.step()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_bad_step_counts_are_refused():
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        GradientAccumulationConfig(num_steps=0)
