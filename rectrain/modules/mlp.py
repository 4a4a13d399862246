"""``torchrec.modules.mlp`` at rectrain's path (implemented in ``rectrain.models.mlp``)."""

from rectrain.models.mlp import MLP, Perceptron

__all__ = ["MLP", "Perceptron"]
