"""``Perceptron`` and ``MLP`` (``torchrec.modules.mlp``): stacked Linear + activation layers.

Submodule names match TorchRec's (``_mlp.<i>._linear``), so a TorchRec state dict of a DLRM loads as is.
"""

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from rectrain.errors import ConfigError

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": torch.relu, "sigmoid": torch.sigmoid}


def check_layer_sizes(name: str, sizes: Sequence[int], *, allow_empty: bool = False) -> list[int]:
    """``sizes`` as a list of positive ints, or a ConfigError naming ``name``."""
    sizes = list(sizes)
    if not sizes and not allow_empty:
        raise ConfigError(f"{name} must list at least one layer size, got []")
    for position, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"{name}[{position}] must be a positive int, got {size!r}")
    return sizes


class Perceptron(nn.Module):
    """``activation(linear(x))``: one fully connected layer (``torchrec.modules.mlp.Perceptron``)."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        bias: bool = True,
        activation: Callable[[Tensor], Tensor] = torch.relu,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self._in_size, self._out_size = in_size, out_size
        self._linear = nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
        self._activation_fn = activation

    def forward(self, input: Tensor) -> Tensor:
        return self._activation_fn(self._linear(input))


class MLP(nn.Module):
    """Perceptrons ``in_size -> layer_sizes[0] -> ... -> layer_sizes[-1]``, each followed by ``activation``.

    ``activation`` is ``"relu"``, ``"sigmoid"`` or a callable; every layer, the last included, applies it
    (as in TorchRec).
    """

    def __init__(
        self,
        in_size: int,
        layer_sizes: Sequence[int],
        bias: bool = True,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_layer_sizes("in_size", [in_size])
        sizes = check_layer_sizes("layer_sizes", layer_sizes, allow_empty=True)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ConfigError(
                    f"activation must be one of {sorted(_ACTIVATIONS)} or a callable, got {activation!r}"
                )
            activation = _ACTIVATIONS[activation]
        ins = [in_size, *sizes[:-1]]
        self._mlp = nn.Sequential(
            *[Perceptron(i, o, bias, activation, device, dtype) for i, o in zip(ins, sizes)]
        )

    def forward(self, input: Tensor) -> Tensor:
        return self._mlp(input)
