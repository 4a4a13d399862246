"""DeepFM's deep part and its factorization machine over lists of [batch, n, dim] embeddings."""

import torch
from torch import nn

from rectrain.fx import symbolic_trace
from rectrain.models.deepfm import DeepFM, FactorizationMachine


def test_deep_part_applies_its_module_to_the_flattened_concatenation():
    embeddings = [torch.randn(3, 2, 4), torch.randn(3, 1, 5)]
    linear = nn.Linear(13, 2)
    expected = linear(torch.cat([embeddings[0].reshape(3, 8), embeddings[1].reshape(3, 5)], dim=1))
    torch.testing.assert_close(DeepFM(linear)(embeddings), expected)


def test_fm_is_the_sum_of_pairwise_products():
    embeddings = [torch.randn(4, 2, 3), torch.randn(4, 1, 2)]
    x = torch.cat([e.flatten(1) for e in embeddings], dim=1)
    pairs = sum(x[:, i] * x[:, j] for i in range(x.shape[1]) for j in range(i + 1, x.shape[1]))
    torch.testing.assert_close(FactorizationMachine()(embeddings), pairs.unsqueeze(1))


def test_both_trace_and_script():
    embeddings = [torch.randn(2, 2, 2)]
    for module in (DeepFM(nn.Linear(4, 1)), FactorizationMachine()):
        scripted = torch.jit.script(symbolic_trace(module))
        torch.testing.assert_close(scripted(embeddings), module(embeddings))
