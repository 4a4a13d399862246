"""SemisyncOptimizer: local SGD steps every step, an outer (DiLoCo-style) step every ``num_local_steps``, and
a checkpoint of both members and the step counters through the keyed state dict."""

from __future__ import annotations

import torch

from rectrain.optim.keyed import KeyedOptimizerWrapper
from rectrain.optim.semi_sync import SemisyncOptimizer


class _OuterAverage(torch.optim.Optimizer):
    """An outer optimizer: ``global_step`` moves each parameter half way back to its anchor (the value at
    the last outer step) and re-anchors there."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__(params, {})
        for p in params:
            self.state[p]["anchor"] = p.detach().clone()

    def step(self, closure=None) -> None:  # noqa: ANN001 - torch's signature
        return None

    def global_step(self, local_steps: torch.Tensor, closure=None) -> None:  # noqa: ANN001
        for group in self.param_groups:
            for p in group["params"]:
                anchor = self.state[p]["anchor"]
                p.copy_(anchor + 0.5 * (p - anchor))
                anchor.copy_(p)


def _build(weight: torch.Tensor) -> tuple[torch.nn.Parameter, SemisyncOptimizer]:
    param = torch.nn.Parameter(weight.clone())
    local = KeyedOptimizerWrapper({"w": param}, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    outer = KeyedOptimizerWrapper({"w": param}, _OuterAverage)
    return param, SemisyncOptimizer([param], local, outer, num_local_steps=2)


def _train(param: torch.nn.Parameter, optimizer: SemisyncOptimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        (param**2).sum().backward()
        optimizer.step()


def test_outer_step_every_num_local_steps_matches_the_manual_schedule() -> None:
    start = torch.tensor([1.0, -2.0])
    param, optimizer = _build(start)
    _train(param, optimizer, 4)
    expected, anchor = start.clone(), start.clone()
    reference = torch.optim.SGD([expected := torch.nn.Parameter(expected)], lr=0.1, momentum=0.9)
    for step in range(1, 5):
        reference.zero_grad()
        (expected**2).sum().backward()
        reference.step()
        if step % 2 == 0:
            with torch.no_grad():
                expected.copy_(anchor + 0.5 * (expected - anchor))
                anchor = expected.detach().clone()
    torch.testing.assert_close(param.detach(), expected.detach())
    assert (optimizer._local_step_counter.item(), optimizer._global_step_counter.item()) == (4, 2)


def test_state_dict_round_trip_restores_both_members_and_the_counters() -> None:
    param, optimizer = _build(torch.tensor([1.0, -2.0]))
    _train(param, optimizer, 3)
    saved = {k: {n: v.clone() for n, v in s.items()} for k, s in optimizer.state_dict()["state"].items()}
    assert set(saved["w"]) == {
        "semi_sync_local_momentum_buffer",
        "semi_sync_global_anchor",
        "__semisync_global_step_counter__",
        "__semisync_local_step_counter__",
    }
    other_param, other = _build(param.detach())
    _train(other_param, other, 1)  # creates the local state the checkpoint loads into
    other.load_state_dict({"state": saved})
    with torch.no_grad():
        other_param.copy_(param)  # the model's weights come back with the model's own state dict
    assert (other._local_step_counter.item(), other._global_step_counter.item()) == (3, 1)
    _train(param, optimizer, 1)
    _train(other_param, other, 1)
    torch.testing.assert_close(other_param.detach(), param.detach())
    assert other._global_step_counter.item() == 2
