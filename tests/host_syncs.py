"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode``: count what would make the host wait for a GPU.

On CUDA, reading a device tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``,
``.numpy()``), an op whose output size depends on the data (``nonzero``, ``masked_select``, ``unique``,
boolean indexing, ``repeat_interleave`` without ``output_size``) and a tensor built from Python numbers
during a step (``torch.tensor([...])``: a copy from pageable host memory) each block the host until the GPU
catches up. On CPU none of these waits, so a training step can grow them unnoticed; this counter sees them
on CPU tensors, which the same code would hold on the GPU.

``.item()``/``bool()``/``int()`` and the data-dependent ops reach a ``TorchDispatchMode`` (they lower to
``aten::_local_scalar_dense`` and the named ops); ``.tolist()`` and ``.numpy()`` read CPU memory without
dispatching, so the counter also wraps those two methods while it is active. Each event records the first
frame inside ``rectrain``/``recserve`` that caused it, so a failing test names the line.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose output size (or a Python value) depends on tensor data: a device-to-host read on CUDA.
_SYNCING_OPS = {
    aten._local_scalar_dense.default: "item/bool/int",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.equal.default: "equal",
    aten.lift_fresh.default: "tensor from Python data",
}

_OURS = ("/rectrain/", "/recserve/")


# torch's own plumbing between a caller and the op (dispatch, Tensor methods written in Python, torch.unique
# and friends); a frame of torch outside these (torch.optim, say) is torch's code asking for the value.
_PLUMBING = (
    "host_syncs",
    "/torch/utils/_python_dispatch.py",
    "/torch/_tensor.py",
    "/torch/functional.py",
    "/torch/_ops.py",
    "/torch/overrides.py",
    "/torch/_jit_internal.py",
    "/torch/_compile.py",
    "/torch/_dynamo/",
)


def _site() -> str:
    """Path, line and function of the innermost frame that asked for the value, then the names of the
    functions of ours that led to it (``path:line:function<caller<caller...``)."""
    stack = traceback.extract_stack()
    callers = "<".join(f.name for f in reversed(stack) if any(p in f.filename for p in _OURS))
    for frame in reversed(stack):
        if any(part in frame.filename for part in _PLUMBING):
            continue
        return f"{frame.filename}:{frame.lineno}:{frame.name}<{callers}"
    return "?"


def _short(site: str) -> str:
    """``package/file.py:line (function)``."""
    path, line, function = site.split("<")[0].rsplit(":", 2)
    return "/".join(path.split("/")[-2:]) + f":{line} ({function})"


@dataclass
class HostSyncs:
    """What a ``count_host_syncs()`` block saw: (kind, site) per event."""

    events: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.events)

    def ours(self) -> HostSyncs:
        """The events our packages caused themselves (not FBGEMM's or torch.optim's, which read host
        tensors there: FBGEMM keeps its step counter on the host, torch's optimizers their steps)."""
        mine = [(k, site) for k, site in self.events if any(p in site.split("<")[0] for p in _OURS)]
        return HostSyncs(mine)

    def outside(self, functions: set[str]) -> list[str]:
        """The events not reached through any of ``functions`` (reads of host data by design)."""
        return [
            f"{kind} at {_short(site)}"
            for kind, site in self.events
            if not functions & set(site.split(":")[-1].split("<"))
        ]

    def by_site(self) -> Counter:
        return Counter(f"{kind} at {_short(site)}" for kind, site in self.events)

    def __str__(self) -> str:
        return ", ".join(f"{what} x{n}" for what, n in self.by_site().most_common()) or "none"


class _Mode(TorchDispatchMode):
    def __init__(self, seen: HostSyncs) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _SYNCING_OPS.get(func)
        if kind is None and func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            kind = "repeat_interleave without output_size"
        if kind is None and func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
            indices = args[1] if len(args) > 1 else ()
            if any(i is not None and i.dtype == torch.bool for i in indices):
                kind = "boolean index"
        if kind is not None:
            self.seen.events.append((kind, _site()))
        return func(*args, **kwargs)


class count_host_syncs:  # noqa: N801 (used like a function: ``with count_host_syncs() as syncs``)
    """Context manager counting host syncs (as on CUDA) of the code run inside it."""

    def __init__(self) -> None:
        self.seen = HostSyncs()
        self._mode = _Mode(self.seen)
        self._originals: dict[str, object] = {}

    def _wrap(self, name: str) -> None:
        original = getattr(torch.Tensor, name)
        seen = self.seen

        def counted(tensor, *args, **kwargs):
            seen.events.append((name, _site()))
            return original(tensor, *args, **kwargs)

        self._originals[name] = original
        setattr(torch.Tensor, name, counted)

    def __enter__(self) -> HostSyncs:
        for name in ("tolist", "numpy"):
            self._wrap(name)
        self._mode.__enter__()
        return self.seen

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
