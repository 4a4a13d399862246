"""Backward injection: a hook at a module's parameter fires once per backward with that parameter's complete
gradient; an activation hook fires with the gradient of the tensor its finder picks; removing stops both."""

import pytest
import torch
from torch import nn

from rectrain.sparse import KeyedJaggedTensor
from rectrain.train.backward_injection import (
    FirstGradTensorFinder,
    InjectionSite,
    InjectionTargetType,
    register_backward_hook,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def test_param_grad_hook_sees_the_accumulated_gradient_of_the_chosen_parameter() -> None:
    model = _model()
    seen: list[torch.Tensor] = []
    site = InjectionSite("0", FirstGradTensorFinder(), InjectionTargetType.PARAM_GRAD, hook_position=0.0)
    handle = register_backward_hook(site, model, lambda grad: seen.append(grad.clone()))
    model(torch.randn(5, 3)).sum().backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], model[0].weight.grad)  # position 0.0: the first parameter (weight)
    handle.remove()
    model(torch.randn(5, 3)).sum().backward()
    assert len(seen) == 1


def test_activation_hook_gets_the_gradient_of_the_found_output() -> None:
    model = _model()
    seen: list[torch.Tensor] = []
    handle = register_backward_hook(InjectionSite("2", FirstGradTensorFinder()), model, seen.append)
    model(torch.randn(5, 3)).mul(2.0).sum().backward()
    torch.testing.assert_close(seen[0], torch.full((5, 1), 2.0))
    handle.remove()


def test_finder_reads_kjt_weights_and_bad_sites_are_named() -> None:
    weights = torch.ones(3, requires_grad=True)
    kjt = KeyedJaggedTensor(
        keys=["f"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]), weights=weights
    )
    assert FirstGradTensorFinder(use_input=True)(None, {"features": kjt}, None) is weights
    with pytest.raises(ValueError, match="'nope' not found"):
        register_backward_hook(InjectionSite("nope", FirstGradTensorFinder()), _model(), print)
    frozen = _model().requires_grad_(False)
    site = InjectionSite("0", FirstGradTensorFinder(), InjectionTargetType.PARAM_GRAD)
    with pytest.raises(AssertionError, match="no_requires_grad=2"):
        register_backward_hook(site, frozen, print)
