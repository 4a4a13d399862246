"""Optimizers addressed by parameter name, as ``torchrec.optim.keyed``: ``KeyedOptimizer``, its wrappers and
``CombinedOptimizer``.

All are ``torch.optim.Optimizer`` instances, so torch's LR schedulers drive them through
``param_groups[i]["lr"]``. ``state_dict()`` is ``{"state": {param_key: {state_key: value}}}`` plus
``"param_groups"`` (parameter keys instead of indices) once ``save_param_groups(True)`` was called, as in
TorchRec. ``load_state_dict`` copies tensors *in place*, so state that lives inside a kernel's storage (FBGEMM
momentum buffers) is restored where the kernel reads it.

``CombinedOptimizer``'s parameter keys are the members' keys prefixed by the member's name
(``"<name>.<key>"``; a member given without a name keeps its keys), so its ``state_dict()`` is one keyed state
dict, as TorchRec's.
Unlike TorchRec, a member may also be a plain ``torch.optim`` optimizer: it is keyed by position
(``"<group>.<index>"``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from copy import deepcopy
from typing import Any

import torch
from torch import Tensor
from torch.distributed._shard.sharded_tensor import ShardedTensor


def _init_hooks(optimizer: torch.optim.Optimizer) -> None:
    """The hook tables ``torch.optim.Optimizer.__init__`` would make (its ``__init__`` is not called)."""
    for name in ("step", "state_dict", "load_state_dict"):
        setattr(optimizer, f"_optimizer_{name}_pre_hooks", OrderedDict())
        setattr(optimizer, f"_optimizer_{name}_post_hooks", OrderedDict())


class KeyedOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose parameters have names (``torchrec.optim.KeyedOptimizer``).

    Args:
        params: parameter key -> parameter.
        state: parameter -> its state (``{state_key: tensor, number, nested dict or object with a
            state_dict()}``); every key must be one of ``params``.
        param_groups: torch's param groups (``{"params": [...], <hyper-parameters>}``).

    Subclasses implement ``step``.
    """

    def __init__(
        self,
        params: Mapping[str, Tensor],
        state: Mapping[Any, Any],
        param_groups: Collection[Mapping[str, Any]],
    ) -> None:
        # torch's Optimizer.__init__ would copy the groups and re-create the state; both are shared instead.
        _init_hooks(self)
        self.state = state
        self.param_groups = param_groups
        self.params = params
        self.defaults: dict[str, Any] = {"_save_param_groups": False}
        known = {id(p) for p in params.values()}
        strangers = [key for key in state if id(key) not in known]
        if strangers:
            raise ValueError(f"All state keys must be params. The following keys are not: {strangers}.")
        self._patch_step_function()

    def __getstate__(self) -> dict[str, Any]:
        # torch's __getstate__ keeps only defaults/state/param_groups; a copy needs the names too.
        return dict(self.__dict__)

    def _keys_by_id(self) -> dict[int, str]:
        return {id(param): key for key, param in self.params.items()}

    def state_dict(self) -> dict[str, Any]:
        """Named state (live tensors, not copies); named param groups once ``save_param_groups(True)``."""
        keys = self._keys_by_id()
        state = {keys[id(param)]: _state_content(values) for param, values in self.state.items()}
        result: dict[str, Any] = {"state": state}
        if self.defaults.get("_save_param_groups"):
            result["param_groups"] = [
                {"params": sorted(keys[id(p)] for p in group["params"])}
                | {k: deepcopy(v) for k, v in group.items() if k != "params"}
                for group in self.param_groups
            ]
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Copy saved state into this optimizer's tensors (in place); restore the param groups' values when
        both sides save them. The state must already exist (``init_state``) and match key for key."""
        saved = state_dict["state"]
        if len(self.state) != len(saved):
            raise ValueError(f"Different parameter count: {len(self.state)} vs {len(saved)}")
        for key, param in self.params.items():
            if param not in self.state:
                continue
            if key not in saved:
                raise ValueError(f"Parameter {key} not found")
            own = self.state[param]
            if len(own) != len(saved[key]):
                raise ValueError(f"Different state size of {key}: {len(own)} vs {len(saved[key])}")
            self._load_into(own, saved[key], key)
        if self.defaults.get("_save_param_groups") and "param_groups" in state_dict:
            self._load_param_groups(state_dict["param_groups"])
        self.post_load_state_dict()

    def _load_into(self, own: dict[str, Any], saved: Mapping[str, Any], where: str) -> None:
        for name, value in own.items():
            if name not in saved:
                raise ValueError(f"optimizer state {where}.{name} not found in the saved state")
            new = saved[name]
            if isinstance(value, dict):
                self._load_into(value, new, f"{where}.{name}")
            elif callable(getattr(value, "load_state_dict", None)):
                value.load_state_dict(new)
            elif isinstance(value, Tensor):
                with torch.no_grad():
                    self._copy_state(f"optimizer state {name!r} of {where!r}", value, new)
            else:
                own[name] = deepcopy(new)

    def _copy_state(self, where: str, tensor: Any, saved: Any) -> None:
        """Copy one saved state tensor into ``tensor`` (subclasses holding sharded state override this)."""
        if isinstance(tensor, ShardedTensor):
            mine, theirs = tensor.local_shards(), saved.local_shards()
            if len(mine) != len(theirs):
                raise ValueError(f"{where}: different number of shards {len(mine)} vs {len(theirs)}")
            for shard, new in zip(mine, theirs):
                shard.tensor.detach().copy_(new.tensor)
            return
        value = torch.as_tensor(saved)
        if value.shape != tensor.shape and value.numel() != 1:
            raise ValueError(
                f"{where}: saved shape {tuple(value.shape)} does not match {tuple(tensor.shape)}"
            )
        tensor.detach().copy_(value)

    def _load_param_groups(self, saved_groups: list[Mapping[str, Any]]) -> None:
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"Different param_groups count: {len(self.param_groups)} vs {len(saved_groups)}")
        keys = self._keys_by_id()
        saved_by_params = {"/".join(sorted(g["params"])): g for g in saved_groups}
        for group in self.param_groups:
            name = "/".join(sorted(keys[id(p)] for p in group["params"]))
            if name not in saved_by_params:
                raise ValueError(f"Group {name} not found")
            for key, value in saved_by_params[name].items():
                if key != "params":
                    group[key] = deepcopy(value)

    def post_load_state_dict(self) -> None:
        """Called after ``load_state_dict`` (subclasses re-derive what depends on the state)."""

    def add_param_group(self, param_group: Any) -> None:
        raise NotImplementedError("a KeyedOptimizer's parameters are fixed at construction")

    def init_state(self, sparse_grad_parameter_names: set[str] | None = None) -> None:
        """Create the (usually lazy) state with one step on zero gradients, so a checkpoint can load in
        place; parameters named in ``sparse_grad_parameter_names`` get sparse zero gradients."""
        for key, param in self.params.items():
            if param.requires_grad:
                zeros = torch.zeros_like(param)
                if sparse_grad_parameter_names is not None and key in sparse_grad_parameter_names:
                    zeros = zeros.to_sparse()
                param.grad = zeros
        self.step(closure=None)

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = save


def _state_content(values: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter's state with every object that has a ``state_dict()`` replaced by it (nested dicts too)."""
    result = {}
    for key, value in values.items():
        if isinstance(value, dict):
            result[key] = _state_content(value)
        elif callable(getattr(value, "state_dict", None)):
            result[key] = value.state_dict()
        else:
            result[key] = value
    return result


class KeyedOptimizerWrapper(KeyedOptimizer):
    """A torch optimizer built by ``optim_factory`` over ``params`` and exposed by key
    (``torchrec.optim.KeyedOptimizerWrapper``); ``pass_params_dict`` hands the factory the dict itself."""

    def __init__(
        self,
        params: Mapping[str, Tensor],
        optim_factory: Callable[[Any], torch.optim.Optimizer],
        pass_params_dict: bool = False,
    ) -> None:
        self._optimizer = optim_factory(params if pass_params_dict else list(params.values()))
        super().__init__(params, self._optimizer.state, self._optimizer.param_groups)

    def zero_grad(self, set_to_none: bool = False) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self._optimizer.step(closure=closure)


class OptimizerWrapper(KeyedOptimizer):
    """A ``KeyedOptimizer`` around another one, for wrappers that change ``step`` (warm-up, clipping)."""

    def __init__(self, optimizer: KeyedOptimizer) -> None:
        self._optimizer = optimizer
        super().__init__(optimizer.params, optimizer.state, optimizer.param_groups)

    def __repr__(self) -> str:
        return repr(self._optimizer)

    def zero_grad(self, set_to_none: bool = False) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self._optimizer.step(closure=closure)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)
        self.state, self.param_groups = self._optimizer.state, self._optimizer.param_groups
        self.post_load_state_dict()

    def post_load_state_dict(self) -> None:
        self._optimizer.post_load_state_dict()

    def save_param_groups(self, save: bool) -> None:
        self._optimizer.save_param_groups(save)


# CombinedOptimizer: named optimizers stepped, zeroed and checkpointed as one (TorchRec keeps it here too).


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
        _init_hooks(self)
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


__all__ = ["CombinedOptimizer", "KeyedOptimizer", "KeyedOptimizerWrapper", "OptimizerWrapper"]
