"""``CombinedOptimizer``: named optimizers stepped, zeroed and checkpointed as one
(``torchrec.optim.CombinedOptimizer``).

Its parameter keys are the members' keys prefixed by the member's name (``"<name>.<key>"``; a member given
without a name keeps its keys), so ``state_dict()`` is one keyed state dict, as TorchRec's. Unlike TorchRec,
a member may also be a plain ``torch.optim`` optimizer: it is keyed by position (``"<group>.<index>"``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from rectrain.optim.keyed import KeyedOptimizer, KeyedOptimizerWrapper


def _keyed(optimizer: torch.optim.Optimizer) -> KeyedOptimizer:
    """``optimizer`` itself if keyed, else a keyed view over its parameters named by position."""
    if isinstance(optimizer, KeyedOptimizer):
        return optimizer
    params = {
        f"{g}.{i}": p for g, group in enumerate(optimizer.param_groups) for i, p in enumerate(group["params"])
    }
    return KeyedOptimizerWrapper(params, lambda _: optimizer)


class CombinedOptimizer(KeyedOptimizer):
    """Several optimizers as one; ``optims`` holds optimizers or ``(name, optimizer)`` pairs.

    ``param_groups`` lists every member's groups (the members' own dicts): an LR scheduler over the combined
    optimizer changes each member's learning rate. ``step`` evaluates a closure once, then steps every member.
    """

    def __init__(self, optims: Sequence[torch.optim.Optimizer | tuple[str, torch.optim.Optimizer]]) -> None:
        self._optims: list[tuple[str, torch.optim.Optimizer]] = []
        self._keyed: list[tuple[str, KeyedOptimizer]] = []
        for position, item in enumerate(optims):
            name, optimizer = ("", item) if isinstance(item, torch.optim.Optimizer) else item
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(
                    f"optims[{position}] must be an optimizer or a (name, optimizer) pair, got {item!r}"
                )
            self._optims.append((name, optimizer))
            self._keyed.append((name, _keyed(optimizer)))
        self.defaults: dict[str, Any] = {
            "_save_param_groups": bool(self._keyed)
            and self._keyed[0][1].defaults.get("_save_param_groups", False)
        }
        seen: set[str] = set()
        for name, optimizer in self._keyed:
            for key in optimizer.params:
                full = self.prepend_opt_key(key, name)
                if full in seen:
                    raise ValueError(f"Duplicate param key {full}")
                seen.add(full)
        self._optimizer_step_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._patch_step_function()

    def __repr__(self) -> str:
        return ",".join(f"{name}: {optimizer!r}" for name, optimizer in self._optims)

    @staticmethod
    def prepend_opt_key(name: str, opt_key: str) -> str:
        """``"<opt_key>.<name>"``, or ``name`` alone for a member without a name."""
        return f"{opt_key}.{name}" if opt_key else name

    @property
    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        """The members as given, with their names."""
        return list(self._optims)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [group for _, optimizer in self._optims for group in optimizer.param_groups]

    @property
    def params(self) -> dict[str, Tensor]:  # type: ignore[override]
        return {self.prepend_opt_key(k, name): p for name, opt in self._keyed for k, p in opt.params.items()}

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        return {param: values for _, optimizer in self._keyed for param, values in optimizer.state.items()}

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for _, optimizer in self._optims:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = False) -> None:
        for _, optimizer in self._optims:
            optimizer.zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Each member loads its part (its keys, prefix removed), so a member's own loading rules apply."""
        state = dict(state_dict["state"])
        groups = state_dict.get("param_groups")
        for name, optimizer in self._keyed:
            own = {self.prepend_opt_key(k, name): k for k in optimizer.params}
            part: dict[str, Any] = {"state": {own[k]: state.pop(k) for k in list(state) if k in own}}
            if groups is not None:
                part["param_groups"] = [
                    {**g, "params": [own[k] for k in g["params"]]}
                    for g in groups
                    if all(k in own for k in g["params"])
                ]
            optimizer.load_state_dict(part)
        if state:
            raise ValueError(f"Parameter {sorted(state)[0]} not found (unexpected keys: {sorted(state)})")

    def post_load_state_dict(self) -> None:
        for _, optimizer in self._keyed:
            optimizer.post_load_state_dict()

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = save
        for _, optimizer in self._keyed:
            optimizer.save_param_groups(save)
