"""Which tracer runs: TorchDynamo (``torch.compile``, strict export) or non-strict ``torch.export``.

The sparse types take a few different paths under tracing (no host syncs they can avoid, ``torch._check``
hints for sizes that come from data); these predicates say which. They are plain Python: TorchScript code
reaches them only behind ``not torch.jit.is_scripting()``.
"""

from __future__ import annotations

import torch


def is_torchdynamo_compiling() -> bool:
    """True while TorchDynamo traces (``torch.compile``, strict ``torch.export``)."""
    return torch.compiler.is_dynamo_compiling()


def is_non_strict_exporting() -> bool:
    """True while non-strict ``torch.export`` traces (fake tensors, no Dynamo)."""
    return torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling()


def is_pt2_compiling() -> bool:
    """True under any PT2 tracer (Dynamo or non-strict export)."""
    return torch.compiler.is_compiling()


def check_sizes(sizes: list[int]) -> None:
    """Tell the PT2 tracer that these data-dependent ints are sizes (non-negative), so slicing with them
    needs no guard; a no-op in eager mode."""
    if is_pt2_compiling():
        for size in sizes:
            torch._check(size >= 0)
