"""``torchrec.modules.activation``: ``SwishLayerNorm``, ``Y = X * sigmoid(LayerNorm(X))``."""

# No postponed annotations: torch.fx copies forward's annotations into the code it generates for TorchScript.

import torch
from torch import nn


class SwishLayerNorm(nn.Module):
    """Swish gated by a layer norm over ``input_dims`` (the trailing dimensions), as TorchRec's."""

    def __init__(self, input_dims: int | list[int] | torch.Size, device: torch.device | None = None) -> None:
        super().__init__()
        self.norm = nn.Sequential(nn.LayerNorm(input_dims, device=device), nn.Sigmoid())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input * self.norm(input)


__all__ = ["SwishLayerNorm"]
