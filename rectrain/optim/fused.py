"""The optimizer object of an embedding collection whose update runs inside backward (fused in the kernel).

There is nothing to do in ``step()``: the kernel already updated the rows during backward. The object exists
so that training code treats embeddings like any other optimizer: read and set ``param_groups[0]["lr"]`` (the
kernel picks it up immediately), checkpoint the state, combine it with a dense optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from torch import Tensor

from rectrain.embedding.config import EmbOptimType, FusedOptimizerConfig
from rectrain.optim.keyed import KeyedOptimizer


class FusedKernel(Protocol):
    """What the optimizer needs from a kernel that updates embeddings in backward."""

    def set_learning_rate(self, lr: float) -> None: ...


class _LiveParamGroup(dict):
    """A param group whose ``"lr"`` is pushed to the kernels as soon as it is set (by code or a scheduler).

    The kernels' other hyper-parameters are fixed when they are built; setting one to a new value raises
    instead of being silently ignored.
    """

    def __init__(
        self, values: Mapping[str, Any], kernels: Sequence[FusedKernel], fixed: Iterable[str]
    ) -> None:
        self._kernels = list(kernels)
        self._fixed = frozenset(fixed)
        super().__init__()
        self.update(values)

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self._fixed and key in self and value != self[key]:
            raise ValueError(
                f"{key} of a fused embedding optimizer is fixed at construction ({self[key]!r}); "
                f"cannot set {value!r}. Only lr can change during training."
            )
        super().__setitem__(key, value)
        if key == "lr":
            for kernel in self._kernels:
                kernel.set_learning_rate(float(value))

    def update(self, *args: Any, **kwargs: Any) -> None:  # dict.update would bypass __setitem__
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def _hyperparameters(config: FusedOptimizerConfig) -> dict[str, Any]:
    """The config's hyper-parameters under torch.optim's names (``betas`` for Adam)."""
    values: dict[str, Any] = {"lr": config.lr}
    if config.optimizer is not EmbOptimType.SGD:
        values["eps"] = config.eps
    values["weight_decay"] = config.weight_decay
    if config.optimizer is EmbOptimType.ADAM:
        values["betas"] = (config.beta1, config.beta2)
    return values


class FusedEmbeddingOptimizer(KeyedOptimizer):
    """``collection.fused_optimizer``: one param group over the collection's table weights.

    State keys follow TorchRec: ``state_dict()["state"]["embedding_bags.<table>.weight"]`` holds
    ``"<table>.momentum1"`` (Adagrad, row-wise Adagrad) or ``"<table>.exp_avg"``, ``"<table>.exp_avg_sq"``,
    ``"<table>.step"`` (Adam). The tensors are views of the kernels' storage; ``load_state_dict`` writes
    into it.

    Args:
        params: parameter name -> table weight.
        state_fn: returns the current ``{param name: {state name: tensor view}}``; called whenever the state
            is read, so the views always point at the kernels' current storage.
        kernels: the kernels whose learning rate follows ``param_groups[0]["lr"]``.
        config: the hyper-parameters the kernels were built with.
    """

    def __init__(
        self,
        params: Mapping[str, Tensor],
        state_fn: Callable[[], Mapping[str, dict[str, Tensor]]],
        kernels: Sequence[FusedKernel],
        config: FusedOptimizerConfig,
    ) -> None:
        hyper = _hyperparameters(config)
        group = _LiveParamGroup(
            {"params": list(params.values()), **hyper}, kernels, fixed=[k for k in hyper if k != "lr"]
        )
        super().__init__(params, {}, [group])
        self.optimizer_type = config.optimizer
        self._state_fn = state_fn
        self._refresh_state()

    def __call__(self) -> FusedEmbeddingOptimizer:
        """Itself: TorchRec's fused modules spell it ``module.fused_optimizer()``."""
        return self

    def _refresh_state(self) -> None:
        self.state.clear()
        for key, values in self._state_fn().items():
            if values:
                self.state[self.params[key]] = dict(values)

    def state_dict(self) -> dict[str, Any]:
        self._refresh_state()
        return super().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._refresh_state()
        super().load_state_dict(state_dict)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """No-op: the kernel applied the update during backward. Returns the closure's loss if given."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: no embedding gradient is ever materialised."""
