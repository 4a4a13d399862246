"""Every difference between the torch / FBGEMM pairs we support, in one place.

Users have two pairs (FBGEMM 1.X is built against torch 2.(X+5)): torch 2.13 + FBGEMM 1.8, the default CPU
install, and torch 2.11 + FBGEMM 1.6, what CUDA machines with a torch 2.11 image take. FBGEMM's Python API
and the schemas of the ops we call are the same in 1.6 and 1.8 (compared op by op); torch differs in:

  all_gather_single / reduce_scatter_single   new in 2.13; 2.11 has all_gather_into_tensor /
                                              reduce_scatter_tensor (2.13 deprecates those, FutureWarning)
  DistributedDataParallel(forward_sync_buffers=...)   new in 2.13; in 2.11 broadcast_buffers=False also
                                              skips the one buffer broadcast at construction

Each difference is decided once, at import, from what the running torch has (never from version strings,
so a 2.12 that has one but not the other still works). ``SUPPORTED_PAIRS`` is what pyproject.toml states.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

logger = logging.getLogger(__name__)

# (torch, fbgemm-gpu, torchrec) minor versions, newest first; pyproject.toml's [tool.rectrain] says the same
# (tests/test_compat.py checks).
SUPPORTED_PAIRS: tuple[tuple[str, str, str], ...] = (("2.13", "1.8", "1.8"), ("2.11", "1.6", "1.6"))


def pick(namespace: ModuleType | Any, new: str, old: str) -> Callable[..., Any]:
    """``namespace.new`` where it exists, else ``namespace.old`` (same arguments, older name)."""
    found = getattr(namespace, new, None)
    return found if found is not None else getattr(namespace, old)


_all_gather_single = pick(dist, "all_gather_single", "all_gather_into_tensor")
_reduce_scatter_single = pick(dist, "reduce_scatter_single", "reduce_scatter_tensor")


def all_gather_single(
    output: Tensor, tensor: Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> dist.Work | None:
    """Every rank's equally sized ``tensor`` concatenated along dim 0 into ``output`` (torch 2.13's
    ``dist.all_gather_single``)."""
    return _all_gather_single(output, tensor, group, async_op)


def reduce_scatter_single(
    output: Tensor,
    tensor: Tensor,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> dist.Work | None:
    """Reduce ``tensor`` over ranks and give rank r block r of dim 0 (torch 2.13's
    ``dist.reduce_scatter_single``)."""
    return _reduce_scatter_single(output, tensor, op, group, async_op)


def has_forward_sync_buffers(ddp_class: type = DistributedDataParallel) -> bool:
    """Whether ``ddp_class`` separates the buffer sync at construction from the one before every forward."""
    return "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters


def buffers_once_kwargs(separate: bool) -> dict[str, bool]:
    """DDP keyword arguments for 'sync buffers at construction, never before a forward': ``separate`` says
    whether DDP has ``forward_sync_buffers`` (else ``broadcast_buffers=False`` skips both syncs and the caller
    broadcasts once itself, :func:`broadcast_buffers`)."""
    return {"forward_sync_buffers": False} if separate else {"broadcast_buffers": False}


def broadcast_buffers(module: nn.Module, ignored: set[str], group: dist.ProcessGroup | None) -> None:
    """Rank 0's buffers (those DDP would sync: not under ``ignored`` names) to every rank of ``group``."""
    source = dist.get_global_rank(group, 0) if group is not None else 0
    for name, buffer in module.named_buffers():
        if name not in ignored:
            dist.broadcast(buffer, src=source, group=group)


def data_parallel(
    module: nn.Module,
    *,
    device_ids: list[torch.device] | None,
    process_group: dist.ProcessGroup | None,
    ignored: set[str],
    separate_buffer_sync: bool | None = None,
    options: dict | None = None,
) -> DistributedDataParallel:
    """``DistributedDataParallel`` over ``module``'s trainable parameters (not those named in ``ignored``),
    gradients as bucket views, buffers synced once at construction and never before a forward (a collective
    and a sync point per step for buffers that never change, e.g. DLRM's triu indices).
    ``separate_buffer_sync`` overrides what the running torch has (tests); ``options`` are more
    ``DistributedDataParallel`` arguments (a ``DefaultDataParallelWrapper``'s)."""
    separate = has_forward_sync_buffers() if separate_buffer_sync is None else separate_buffer_sync
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, sorted(ignored))
    wrapped = DistributedDataParallel(
        module,
        device_ids=device_ids,
        process_group=process_group,
        **{"gradient_as_bucket_view": True, **buffers_once_kwargs(separate), **(options or {})},
    )
    if not separate:
        broadcast_buffers(module, ignored, process_group)
    return wrapped


def minor(version: str) -> str:
    """``"2.11.0+cu130"`` -> ``"2.11"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def running_pair() -> tuple[str, str | None]:
    """(torch, fbgemm-gpu) minor versions of this process (FBGEMM None when it does not import)."""
    try:
        import fbgemm_gpu

        fbgemm = minor(str(getattr(fbgemm_gpu, "__version__", "")))
    except ImportError:
        fbgemm = None
    return minor(torch.__version__), fbgemm


def is_supported(torch_minor: str, fbgemm_minor: str | None) -> bool:
    """Whether the pair is one of ``SUPPORTED_PAIRS``."""
    return any(t == torch_minor and f == fbgemm_minor for t, f, _ in SUPPORTED_PAIRS)
