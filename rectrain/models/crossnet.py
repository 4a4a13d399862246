"""Cross networks of DCN (Wang et al., 2017) and DCN-v2 (Wang et al., 2020), as ``torchrec.modules.crossnet``.

Each layer maps ``[B, N] -> [B, N]``:

    x_{l+1} = x_0 * (W_l x_l + b_l) + x_l            (``*`` elementwise)

with a full ``N x N`` matrix ``W_l`` in ``CrossNet`` and a rank-``r`` product ``W_l = U_l V_l`` (``U_l`` of
shape ``[N, r]``, ``V_l`` of ``[r, N]``) in ``LowRankCrossNet``, which costs ``2 N r`` instead of ``N^2`` per
example. Parameter names and shapes are TorchRec's, so a TorchRec state dict loads as is:
``kernels.<l>`` ``[N, N]`` and ``bias.<l>`` ``[N, 1]`` for ``CrossNet``; ``W_kernels.<l>`` ``[N, r]`` (U),
``V_kernels.<l>`` ``[r, N]`` and ``bias.<l>`` ``[N]`` for ``LowRankCrossNet``.
"""

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional

from rectrain.errors import ConfigError


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")


def _xavier_params(shape: tuple[int, ...], count: int, device: torch.device | str | None) -> nn.ParameterList:
    return nn.ParameterList(
        [nn.Parameter(nn.init.xavier_normal_(torch.empty(shape, device=device))) for _ in range(count)]
    )


def _zero_params(shape: tuple[int, ...], count: int, device: torch.device | str | None) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(torch.zeros(shape, device=device)) for _ in range(count)])


class CrossNet(nn.Module):
    """Full-rank cross layers: ``x_{l+1} = x_0 * (x_l W_l^T + b_l) + x_l`` on ``[B, in_features]``."""

    def __init__(self, in_features: int, num_layers: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        _check_positive("in_features", in_features)
        _check_positive("num_layers", num_layers)
        self._num_layers = num_layers
        self.kernels = _xavier_params((in_features, in_features), num_layers, device)
        self.bias = _zero_params((in_features, 1), num_layers, device)

    def forward(self, input: Tensor) -> Tensor:
        x_0 = input
        x_l = x_0
        for layer in range(self._num_layers):
            x_l = x_0 * functional.linear(x_l, self.kernels[layer], self.bias[layer].squeeze(1)) + x_l
        return x_l


class LowRankCrossNet(nn.Module):
    """Low-rank cross layers (DCN-v2): ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` on ``[B, N]``.

    ``low_rank`` around ``in_features / 4`` keeps most of the full-rank accuracy (TorchRec's guidance).
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        low_rank: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        _check_positive("in_features", in_features)
        _check_positive("num_layers", num_layers)
        _check_positive("low_rank", low_rank)
        self._num_layers = num_layers
        self._low_rank = low_rank
        self.W_kernels = _xavier_params((in_features, low_rank), num_layers, device)
        self.V_kernels = _xavier_params((low_rank, in_features), num_layers, device)
        self.bias = _zero_params((in_features,), num_layers, device)

    def forward(self, input: Tensor) -> Tensor:
        x_0 = input
        x_l = x_0
        for layer in range(self._num_layers):
            x_l_v = functional.linear(x_l, self.V_kernels[layer])
            x_l_w = functional.linear(x_l_v, self.W_kernels[layer], self.bias[layer])
            x_l = x_0 * x_l_w + x_l
        return x_l


class VectorCrossNet(nn.Module):
    """Rank-1 cross layers with one vector per layer (DCN-v1): ``x_{l+1} = x_0 (w_l . x_l) + b_l + x_l``.

    Parameters ``kernels.<l>`` ``[N, 1]`` and ``bias.<l>`` ``[N, 1]``, as TorchRec's.
    """

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check_positive("in_features", in_features)
        _check_positive("num_layers", num_layers)
        self._num_layers = num_layers
        self.kernels = _xavier_params((in_features, 1), num_layers, None)
        self.bias = _zero_params((in_features, 1), num_layers, None)

    def forward(self, input: Tensor) -> Tensor:
        x_0 = input.unsqueeze(2)  # [B, N, 1]
        x_l = x_0
        for layer in range(self._num_layers):
            dot = torch.tensordot(x_l, self.kernels[layer], dims=([1], [0]))  # [B, 1, 1]
            x_l = torch.matmul(x_0, dot) + self.bias[layer] + x_l
        return x_l.squeeze(2)


class LowRankMixtureCrossNet(nn.Module):
    """DCN-v2's mixture of low-rank experts: each layer adds a gated mix of ``num_experts`` crosses
    ``x_0 * (U g(C g(V x_l)) + b)`` (``g`` the activation) to ``x_l``; one expert needs no gate.

    Parameters (TorchRec's names and shapes, created in TorchRec's order so a seed gives TorchRec's values):
    ``U_kernels.<l>`` ``[K, N, r]``, ``V_kernels.<l>`` ``[K, r, N]``, ``bias.<l>`` ``[N, 1]``, ``gates.<k>``
    (``Linear(N, 1)`` without bias, only when ``K > 1``), ``C_kernels.<l>`` ``[K, r, r]``.
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        num_experts: int = 1,
        low_rank: int = 1,
        activation: nn.Module | Callable[[Tensor], Tensor] = torch.relu,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("num_layers", num_layers)):
            _check_positive(name, value)
        _check_positive("num_experts", num_experts)
        _check_positive("low_rank", low_rank)
        self._num_layers, self._num_experts = num_layers, num_experts
        self.U_kernels = _xavier_params((num_experts, in_features, low_rank), num_layers, None)
        self.V_kernels = _xavier_params((num_experts, low_rank, in_features), num_layers, None)
        self.bias = _zero_params((in_features, 1), num_layers, None)
        self.gates = (
            nn.ModuleList([nn.Linear(in_features, 1, bias=False) for _ in range(num_experts)])
            if num_experts > 1
            else None
        )
        self._activation = activation
        self.C_kernels = _xavier_params((num_experts, low_rank, low_rank), num_layers, None)

    def forward(self, input: Tensor) -> Tensor:
        x_0 = input.unsqueeze(2)  # [B, N, 1]
        x_l = x_0
        for layer in range(self._num_layers):
            experts = []
            for i in range(self._num_experts):
                low = self._activation(torch.matmul(self.V_kernels[layer][i], x_l))  # [B, r, 1]
                low = self._activation(torch.matmul(self.C_kernels[layer][i], low))
                expert = x_0 * (torch.matmul(self.U_kernels[layer][i], low) + self.bias[layer])  # [B, N, 1]
                experts.append(expert.squeeze(2))
            stacked = torch.stack(experts, 2)  # [B, N, K]
            if self.gates is not None:
                gating = torch.stack([gate(x_l.squeeze(2)) for gate in self.gates], 1)  # [B, K, 1]
                x_l = torch.matmul(stacked, torch.softmax(gating, 1)) + x_l
            else:
                x_l = stacked + x_l
        return x_l.squeeze(2)
