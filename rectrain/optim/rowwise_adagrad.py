"""``RowWiseAdagrad``: Adagrad with one accumulator per row (``torchrec.optim.RowWiseAdagrad``).

For an embedding table every row keeps the mean of its squared gradients summed over steps, so the state is
``[rows, 1]`` instead of the table's size and a whole row moves with one adaptive rate. It steps dense
gradients like any ``torch.optim`` optimizer; ``DistributedModelParallel`` maps it to the fused row-wise
Adagrad kernel when it is given through ``apply_optimizer_in_backward``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


def _row_mean(values: Tensor) -> Tensor:
    """``[rows, 1]``: the mean over each row (dim 0 indexes rows; a 1-D tensor is one value per row)."""
    return values.reshape(values.shape[0] if values.dim() else 1, -1).mean(dim=1, keepdim=True)


def _per_row(std: Tensor, param: Tensor) -> Tensor:
    """The ``[rows, 1]`` accumulator shaped to broadcast over each row of ``param``."""
    return std.view(-1, *[1] * (param.dim() - 1)) if param.dim() else std.view(())


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over dense gradients; ``state[p]`` holds ``step`` and ``sum`` (``[rows, 1]``).

    Args:
        params: parameters or param groups.
        lr: learning rate.
        lr_decay: the rate at step ``t`` is ``lr / (1 + (t - 1) * lr_decay)``.
        weight_decay: L2 penalty added to the gradient (every row, as the gradient is dense).
        initial_accumulator_value: the accumulators' start value.
        eps: added to the accumulator's square root.
        maximize: ascend instead of descend.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
        **unused: Any,
    ) -> None:
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "eps": eps,
        }
        for name, value in defaults.items():
            if not value >= 0.0:
                raise ValueError(f"RowWiseAdagrad: {name} must be >= 0, got {value}")
        super().__init__(params, {**defaults, "maximize": maximize})
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state[param]
                state["step"] = torch.tensor(0.0)
                start = torch.full_like(param, initial_accumulator_value)
                state["sum"] = _row_mean(start.detach())

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, param.grad, self.state[param], group)
        return loss

    @staticmethod
    def _update(param: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any]) -> None:
        if grad.is_sparse:
            raise RuntimeError("RowWiseAdagrad steps dense gradients; this parameter's gradient is sparse")
        state["step"] += 1
        grad = -grad if group["maximize"] else grad
        if group["weight_decay"]:
            grad = grad.add(param, alpha=group["weight_decay"])
        state["sum"] += _row_mean(grad.pow(2))
        std = state["sum"].sqrt().add_(group["eps"])
        rate = group["lr"] / (1 + (state["step"].item() - 1) * group["lr_decay"])
        param.addcdiv_(grad, _per_row(std, param), value=-rate)
