"""A collection's lookups as one module call, so that ``torch.fx`` and TorchScript see one opaque step.

``rectrain.fx``'s tracer keeps these modules as leaves (a ``call_module`` node), and ``torch.jit.script`` of a
collection, or of its traced graph, compiles everything around them and calls them back in Python
(``torch.jit.ignore``): FBGEMM's training kernels and the fused optimizer are not TorchScript, so a scripted
collection runs, and trains, in a Python process, but cannot be saved for a process without Python.

TorchScript keeps a module's tensors and plain values but drops Python callables, so when a lookup is
scripted it registers its collection's lookup under an integer handle (``__prepare_scriptable__``, which
``torch.jit.script`` calls on every submodule) and the scripted call finds it there. The registry holds weak
references: it keeps no collection alive.
"""

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rectrain.sparse import JaggedTensor, KeyedJaggedTensor

_SCRIPTED: dict[int, weakref.WeakMethod] = {}  # handle -> the lookup of a scripted collection
_HANDLES = itertools.count(1)


class _LookupCall(nn.Module):
    fx_leaf = True

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        super().__init__()
        self._compute = compute
        self._handle = 0

    def __prepare_scriptable__(self) -> "_LookupCall":
        for handle, method in list(_SCRIPTED.items()):
            if method() is None:
                del _SCRIPTED[handle]
        self._handle = next(_HANDLES)
        _SCRIPTED[self._handle] = weakref.WeakMethod(self._compute)
        return self


def _lookup_of(module: nn.Module) -> Callable[[Any], Any]:
    """The Python lookup behind ``module``: its own, or (scripted ``module``) the registered one."""
    compute = getattr(module, "_compute", None)  # a scripted module has no Python callables
    if compute is None:
        compute = _SCRIPTED[module._handle]()
    if compute is None:
        raise RuntimeError("the collection this scripted lookup belongs to no longer exists")
    return compute


class PooledLookupCall(_LookupCall):
    """``forward(kjt) -> [batch, sum of dims]``: the pooled lookups of an ``EmbeddingBagCollection``."""

    @torch.jit.ignore
    def forward(self, features: KeyedJaggedTensor) -> Tensor:
        return _lookup_of(self)(features)


class SequenceLookupCall(_LookupCall):
    """``forward(kjt) -> {embedding name: JaggedTensor}``: the lookups of an ``EmbeddingCollection``."""

    @torch.jit.ignore
    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        return _lookup_of(self)(features)
