"""``script_or_eager``: TorchScript when the function compiles, the same function eagerly when it does not."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from recserve.runtime.scripted import script_or_eager


@script_or_eager
def _clamped_sum(x: Tensor, hi: int) -> Tensor:
    return x.clamp(max=hi).sum()


@script_or_eager
def _pairs(x: Tensor) -> Tensor:
    return torch.stack([x[i] * x[j] for i in range(2) for j in range(2)])  # two generators: not TorchScript


def test_a_function_in_the_subset_runs_compiled_with_the_eager_result():
    x = torch.arange(10)
    assert isinstance(_clamped_sum.compiled(), torch.jit.ScriptFunction)
    assert torch.equal(_clamped_sum(x, 4), _clamped_sum.eager(x, 4))
    assert int(_clamped_sum(x, 4)) == 0 + 1 + 2 + 3 + 4 * 6


def test_a_function_outside_it_runs_eagerly_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="recserve.runtime.scripted"):
        assert _pairs(torch.tensor([2, 3])).tolist() == [4, 6, 6, 9]
    assert _pairs.compiled() is _pairs.eager
    assert "_pairs runs eagerly: TorchScript could not compile it" in caplog.text
