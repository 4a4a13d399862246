"""A ``torch.fx`` tracer for models that take sparse types (``torchrec.fx.symbolic_trace``'s interface).

The sparse types need nothing special from the tracer: their constructors are recorded as graph nodes
(``JaggedTensorMeta``), their methods as method calls, and the operations that loop over their inputs are
``torch.fx.wrap``-ed leaves. What this tracer adds is TorchRec's ``leaf_modules`` argument (modules, by
class name, to keep as calls instead of tracing into), modules that mark themselves ``fx_leaf`` (the
collections' lookups, so that a traced graph scripts) and ``is_fx_tracing()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx, nn


def is_fx_tracing() -> bool:
    """True while ``torch.fx`` symbolically traces (this tracer or torch's)."""
    return fx._symbolic_trace.is_fx_symbolic_tracing()


class Tracer(fx.Tracer):
    """``torch.fx.Tracer`` that also keeps modules whose class name is in ``leaf_modules`` as leaves."""

    def __init__(self, leaf_modules: list[str] | None = None) -> None:
        super().__init__()
        self._leaf_modules = list(leaf_modules or [])

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        # ``fx_leaf``: a collection's lookups (rectrain.embedding.lookup_call), kept whole for TorchScript.
        if type(m).__name__ in self._leaf_modules or getattr(m, "fx_leaf", False):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def symbolic_trace(
    root: nn.Module | Callable[..., Any],
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: list[str] | None = None,
) -> fx.GraphModule:
    """Trace ``root`` (a module or function) into a ``GraphModule``; see ``torch.fx.symbolic_trace``."""
    tracer = Tracer(leaf_modules)
    graph = tracer.trace(root, concrete_args)
    name = root.__class__.__name__ if isinstance(root, nn.Module) else root.__name__
    return fx.GraphModule(tracer.root, graph, name)
