"""``torchrec.optim.semi_sync``: semi-synchronous training as two keyed optimizers, a local one stepped every
step and a global one (DiLoCo-style, its inner optimizer's ``global_step``) every ``num_local_steps``.

Its ``params``/``state``/``param_groups`` are the two members' merged (state keys prefixed by side, the step
counters carried in every global parameter's state), so ``KeyedOptimizer.state_dict``/``load_state_dict``
checkpoint both; ``post_load_state_dict`` splits them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.optim.keyed import KeyedOptimizer

SEMI_SYNC_GLOBAL_OPTIM_KEY = "semi_sync_global_optim"
SEMI_SYNC_LOCAL_OPTIM_KEY = "semi_sync_local_optim"
SEMI_SYNC_GLOBAL_STATE_KEY = "semi_sync_global_"
SEMI_SYNC_LOCAL_STATE_KEY = "semi_sync_local_"
SEMISYNC_GLOBAL_STEP_COUNTER_KEY = "__semisync_global_step_counter__"
SEMISYNC_LOCAL_STEP_COUNTER_KEY = "__semisync_local_step_counter__"
_COUNTERS = (SEMISYNC_GLOBAL_STEP_COUNTER_KEY, SEMISYNC_LOCAL_STEP_COUNTER_KEY)


class SemisyncOptimizer(KeyedOptimizer):
    """``optimizer`` steps every step; ``global_optimizer._optimizer.global_step`` every ``num_local_steps``.

    ``global_params`` (tensors or param groups) are the worker model's parameters the global optimizer
    syncs; ``semi_sync_worker_shard_group``, ``offload_global_model`` and ``non_blocking`` are kept as given.
    """

    def __init__(
        self,
        global_params: Iterable[Any],
        optimizer: KeyedOptimizer,
        global_optimizer: KeyedOptimizer,
        num_local_steps: int = 16,
        semi_sync_worker_shard_group: dist.ProcessGroup | None = None,
        offload_global_model: bool = False,
        non_blocking: bool = False,
    ) -> None:
        # KeyedOptimizer.__init__ is not called: params/state/param_groups are views of the two members.
        self._optimizer, self._global_optimizer = optimizer, global_optimizer
        given = list(global_params)
        grouped = isinstance(given[0], dict)  # IndexError on no parameters, as TorchRec
        self._worker_model_params = [p for g in given for p in g["params"]] if grouped else given
        self._num_local_steps = num_local_steps
        self._local_step_counter = torch.tensor(0, dtype=torch.int64)
        self._global_step_counter = torch.tensor(0, dtype=torch.int64)
        self._worker_shard_group = semi_sync_worker_shard_group
        self._offload_global_model, self._non_blocking = offload_global_model, non_blocking
        self.defaults: dict[str, Any] = {"_save_param_groups": False}

    @property
    def param_groups(self) -> list[Mapping[str, Any]]:  # type: ignore[override]
        return [*self._optimizer.param_groups, *self._global_optimizer.param_groups]

    @property
    def params(self) -> dict[str, Tensor]:  # type: ignore[override]
        merged = dict(self._optimizer.params)
        for key, param in self._global_optimizer.params.items():
            if merged.setdefault(key, param) is not param:
                raise ValueError(f"parameter key {key!r} names different tensors in the two optimizers")
        counters = (self._global_step_counter, self._local_step_counter)
        return {**merged, **dict(zip(_COUNTERS, counters))}

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        merged = {
            p: {SEMI_SYNC_LOCAL_STATE_KEY + k: v for k, v in s.items()}
            for p, s in self._optimizer.state.items()
        }
        counters = dict(zip(_COUNTERS, (self._global_step_counter, self._local_step_counter)))
        for param, state in self._global_optimizer.state.items():
            merged.setdefault(param, {}).update({SEMI_SYNC_GLOBAL_STATE_KEY + k: v for k, v in state.items()})
            merged[param].update(counters)
        return merged

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self._local_step_counter.add_(1)
        self._optimizer.step(closure)
        if self._local_step_counter.item() % self._num_local_steps == 0:
            self._global_step_counter.add_(1)
            self._global_optimizer.zero_grad()
            self._global_optimizer._optimizer.global_step(self._local_step_counter, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)
        self._global_optimizer.zero_grad(set_to_none=set_to_none)

    def post_load_state_dict(self) -> None:
        combined = self.state
        for key, attr in zip(_COUNTERS, ("_global_step_counter", "_local_step_counter")):
            found = [s[key] for s in combined.values() if key in s]
            if not found:
                raise RuntimeError(f"the checkpoint has no {key} in any parameter's state")
            setattr(self, attr, found[0])
        for opt, prefix in (
            (self._optimizer, SEMI_SYNC_LOCAL_STATE_KEY),
            (self._global_optimizer, SEMI_SYNC_GLOBAL_STATE_KEY),
        ):
            split = {p: self._extract_prefixed_state(combined[p], prefix) for p in opt.state if p in combined}
            if any(split.values()):
                opt.state.clear()
                opt.state.update({p: s for p, s in split.items() if s})
            opt.post_load_state_dict()

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = save
        self._optimizer.save_param_groups(save)
        self._global_optimizer.save_param_groups(save)

    def __repr__(self) -> str:
        local, remote = self._optimizer, self._global_optimizer
        return f"{SEMI_SYNC_LOCAL_OPTIM_KEY}: {local!r}, {SEMI_SYNC_GLOBAL_OPTIM_KEY}: {remote!r}"

    @staticmethod
    def _extract_prefixed_state(param_state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        return {k[len(prefix) :]: v for k, v in param_state.items() if k.startswith(prefix)}
