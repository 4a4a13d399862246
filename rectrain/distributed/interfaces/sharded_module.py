"""TorchRec's protocol for writing a sharded module (``ShardedModule``, ``ShardedEmbeddingModule``).

A sharded module splits its forward in four stages that a pipeline can overlap across batches:
``create_context`` (per-batch state), ``input_dist`` (start sending each rank its ids; an awaitable of an
awaitable: splits first, then the ids), ``compute`` (this rank's lookups) and ``output_dist`` (send the
results back; an awaitable). ``forward`` runs them in that order. rectrain's own sharded collections run
the same stages inside ``forward`` with flat ``Pending`` collectives; this base class is for modules written
the TorchRec way.
"""

from __future__ import annotations

import abc
from typing import Any, Generic, TypeVar

from torch import nn

from rectrain.distributed.interfaces.awaitable import Awaitable, LazyAwaitable

CompIn = TypeVar("CompIn")
DistOut = TypeVar("DistOut")
Out = TypeVar("Out")
ShrdCtx = TypeVar("ShrdCtx")


class ShardedModule(abc.ABC, nn.Module, Generic[CompIn, DistOut, Out, ShrdCtx]):
    """A module whose forward is input distribution, computation and output distribution."""

    def __init__(self) -> None:
        super().__init__()
        self._input_dists: list[nn.Module] = []
        self._lookups: list[nn.Module] = []
        self._output_dists: list[nn.Module] = []

    @abc.abstractmethod
    def create_context(self) -> ShrdCtx: ...

    @abc.abstractmethod
    def input_dist(self, ctx: ShrdCtx, *input: Any, **kwargs: Any) -> Awaitable[Awaitable[CompIn]]: ...

    @abc.abstractmethod
    def compute(self, ctx: ShrdCtx, dist_input: CompIn) -> DistOut: ...

    @abc.abstractmethod
    def output_dist(self, ctx: ShrdCtx, output: DistOut) -> LazyAwaitable[Out]: ...

    def compute_and_output_dist(self, ctx: ShrdCtx, input: CompIn) -> LazyAwaitable[Out]:
        """``output_dist(compute(...))``: one call, which pipelines may override to overlap the two."""
        return self.output_dist(ctx, self.compute(ctx, input))

    def forward(self, *input: Any, **kwargs: Any) -> LazyAwaitable[Out]:
        ctx = self.create_context()
        dist_input = self.input_dist(ctx, *input, **kwargs).wait().wait()
        return self.compute_and_output_dist(ctx, dist_input)


class ShardedEmbeddingModule(ShardedModule[CompIn, DistOut, Out, ShrdCtx]):
    """A sharded module whose computation is embedding lookups (``_lookups``, one per sharding type).

    The lookups may be held in a plain list (TorchRec's sharded collections do), so ``train()`` sets their
    mode too.
    """

    def train(self, mode: bool = True) -> ShardedEmbeddingModule:
        super().train(mode)
        for lookup in self._lookups:
            lookup.train(mode)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"lookup {i}: {lookup}" for i, lookup in enumerate(self._lookups))
