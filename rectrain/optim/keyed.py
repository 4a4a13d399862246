"""Optimizers addressed by name: ``KeyedOptimizer`` (TorchRec's state-dict format) and ``CombinedOptimizer``.

Both are ``torch.optim.Optimizer`` instances so that torch's LR schedulers drive them through
``param_groups[i]["lr"]``.
"""

from __future__ import annotations

from collections import ChainMap, OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor


def _check_same_keys(what: str, expected: Collection[str], given: Collection[str]) -> None:
    missing, unexpected = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{what}: missing keys {missing}, unexpected keys {unexpected}")


class KeyedOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose parameters and state tensors have names, as ``torchrec.optim.KeyedOptimizer``.

    ``state_dict()`` is ``{"state": {param_key: {state_key: Tensor}}, "param_groups": [{"params":
    [param_key, ...], <hyper-parameters>}]}``. ``load_state_dict`` copies state tensors *in place*, so state
    that lives inside a kernel's storage (FBGEMM momentum buffers) is restored where the kernel reads it.

    Subclasses implement ``step``; ``self.state`` maps each parameter to its ``{state_key: Tensor}``.
    """

    def __init__(self, params: Mapping[str, Tensor], param_groups: Sequence[dict[str, Any]]) -> None:
        super().__init__(list(param_groups), defaults={})
        self.params: dict[str, Tensor] = dict(params)
        grouped = {id(param) for group in self.param_groups for param in group["params"]}
        assert grouped == set(self._keys_by_id()), "param_groups must hold exactly the named params"

    def __getstate__(self) -> dict[str, Any]:
        # torch's __getstate__ keeps only defaults/state/param_groups; a copy needs the names too.
        return dict(self.__dict__)

    def _keys_by_id(self) -> dict[int, str]:
        return {id(param): key for key, param in self.params.items()}

    def state_dict(self) -> dict[str, Any]:
        """Named state and param groups (the state tensors are the live ones, not copies)."""
        keys = self._keys_by_id()
        state = {keys[id(param)]: dict(values) for param, values in self.state.items()}
        groups = [
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [keys[id(p)] for p in group["params"]],
            }
            for group in self.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Copy saved state into this optimizer's tensors and restore each group's hyper-parameters."""
        _check_same_keys("optimizer state_dict", ("state", "param_groups"), state_dict.keys())
        own = self.state_dict()
        _check_same_keys("optimizer state", own["state"].keys(), state_dict["state"].keys())
        with torch.no_grad():
            for key, tensors in own["state"].items():
                saved = state_dict["state"][key]
                _check_same_keys(f"optimizer state of {key!r}", tensors.keys(), saved.keys())
                for name, tensor in tensors.items():
                    self._copy_state(f"optimizer state {name!r} of {key!r}", tensor, saved[name])
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"saved state has {len(saved_groups)} param groups, this optimizer has "
                f"{len(self.param_groups)}"
            )
        for index, (own_group, group, saved) in enumerate(
            zip(own["param_groups"], self.param_groups, saved_groups)
        ):
            own_keys = own_group["params"]
            if list(saved["params"]) != own_keys:
                raise ValueError(f"param_groups[{index}] holds {list(saved['params'])}, expected {own_keys}")
            for name, value in saved.items():
                if name != "params":
                    group[name] = value

    def _copy_state(self, where: str, tensor: Any, saved: Any) -> None:
        """Copy one saved state value into this optimizer's ``tensor`` (subclasses holding sharded state
        override this)."""
        value = torch.as_tensor(saved)
        if value.shape != tensor.shape:
            raise ValueError(
                f"{where}: saved shape {tuple(value.shape)} does not match {tuple(tensor.shape)}"
            )
        tensor.copy_(value)


class CombinedOptimizer(torch.optim.Optimizer):
    """Named optimizers stepped, zeroed and checkpointed as one (``torchrec.optim.CombinedOptimizer``).

    ``param_groups`` lists the groups of every member, in order, as the members' own dicts: an LR scheduler
    over the combined optimizer changes each member's learning rate. ``state_dict()`` is
    ``{name: member.state_dict()}``; unlike TorchRec, members may be plain ``torch.optim`` optimizers, whose
    state stays in torch's own format under their name.
    """

    def __init__(self, optims: Sequence[tuple[str, torch.optim.Optimizer]]) -> None:
        # torch.optim.Optimizer.__init__ would copy param groups into a list of its own; members'
        # load_state_dict replaces their group dicts, so the groups are read from the members on every access.
        self._optims: list[tuple[str, torch.optim.Optimizer]] = []
        for position, item in enumerate(optims):
            if not (
                isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.optim.Optimizer)
            ):
                raise TypeError(
                    f"optims[{position}] must be a (name, torch.optim.Optimizer) pair, got {item!r}"
                )
            name = item[0]
            if not name or any(name == other for other, _ in self._optims):
                raise ValueError(
                    f"optims[{position}]: optimizer names must be unique and non-empty, got {name!r}"
                )
            self._optims.append(item)
        if not self._optims:
            raise ValueError("optims is empty: CombinedOptimizer needs at least one optimizer")
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._patch_step_function()

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        return list(self._optims)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [group for _, optim in self._optims for group in optim.param_groups]

    @property
    def state(self) -> ChainMap:  # type: ignore[override]
        return ChainMap(*(optim.state for _, optim in self._optims))

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step every member; a closure, if given, is evaluated once (not once per member)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for _, optim in self._optims:
            optim.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, optim in self._optims:
            optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: optim.state_dict() for name, optim in self._optims}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        _check_same_keys(
            "CombinedOptimizer state_dict", [name for name, _ in self._optims], state_dict.keys()
        )
        for name, optim in self._optims:
            optim.load_state_dict(state_dict[name])
