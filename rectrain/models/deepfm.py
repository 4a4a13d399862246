"""DeepFM's two parts over embeddings (``torchrec.modules.deepfm``; Guo et al., 2017).

Both take a list of ``[batch, n, dim]`` tensors (embeddings of any count and width, or dense features laid
out the same way), flattened per example and concatenated:
- ``DeepFM``: the deep part, any module over that concatenation (an MLP, usually); high-order interactions.
- ``FactorizationMachine``: the FM part, ``0.5 * ((sum x)^2 - sum x^2)`` over the concatenation
  (``[batch, 1]``): the second-order interactions of every pair of values.
"""

import torch
from torch import Tensor, nn


@torch.fx.wrap
def _get_flatten_input(inputs: list[Tensor]) -> Tensor:
    """``[batch, sum of n * dim]``: each input flattened per example, concatenated."""
    return torch.cat([tensor.flatten(1) for tensor in inputs], dim=1)


class DeepFM(nn.Module):
    """``dense_module`` applied to the flattened, concatenated embeddings.

    Args:
        dense_module: any module taking ``[batch, sum of n * dim]`` (its input width is the total element
            count of one example's embeddings, e.g. 2*64 + 3*32 for ``[B, 2, 64]`` and ``[B, 3, 32]``).
    """

    def __init__(self, dense_module: nn.Module) -> None:
        super().__init__()
        self.dense_module = dense_module

    def forward(self, embeddings: list[Tensor]) -> Tensor:
        return self.dense_module(_get_flatten_input(embeddings))


class FactorizationMachine(nn.Module):
    """The sum of all pairwise products of the flattened, concatenated embeddings: ``[batch, 1]``."""

    def forward(self, embeddings: list[Tensor]) -> Tensor:
        x = _get_flatten_input(embeddings)
        total = torch.sum(x, dim=1, keepdim=True)
        squares = torch.sum(x * x, dim=1, keepdim=True)
        # (sum x)^2 = sum x^2 + 2 * sum_{i<j} x_i x_j
        return torch.sum(total * total - squares, dim=1, keepdim=True) * 0.5
