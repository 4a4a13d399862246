"""``Pending``: a started collective and the step that turns its raw buffers into the result.

Pipelines start the input all-to-all of batch i+1 while batch i computes, so every collective in
``comm.ops`` can hand back a ``Pending`` instead of blocking. It is deliberately flat: one or
more ``torch.distributed`` work handles plus one ``finish`` callable, never a pending of pendings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
import torch.distributed as dist

from rectrain.distributed.comm.timeouts import collective

T = TypeVar("T")

_NOT_READY = object()


@dataclass
class Pending(Generic[T]):
    """Work in flight and the function that finalises its result.

    ``wait()`` blocks until every work handle has completed (on NCCL: until the current stream is ordered
    after the collective), then calls ``finish`` once; later calls return the same result.
    """

    work: dist.Work | Sequence[dist.Work] | None
    finish: Callable[[], T]
    name: str = "collective"  # the collective and its group, named in the error when it times out
    group: dist.ProcessGroup | None = None
    _result: object = field(default=_NOT_READY, init=False, repr=False)

    def wait(self) -> T:
        """Block until the collective is done and return its finalised result."""
        if self._result is _NOT_READY:
            works = [self.work] if isinstance(self.work, dist.Work) else list(self.work or ())
            # Some backends finish on the waiting thread by copying into the output (gloo's reduce-scatter
            # does); with grad mode on, autograd would record that copy and cut the collective's own backward.
            with torch.no_grad(), collective(self.name, self.group):
                for work in works:
                    work.wait()
            self._result = self.finish()
            self.work = None
        return self._result  # type: ignore[return-value]

    @property
    def done(self) -> bool:
        """True once ``wait()`` has produced the result."""
        return self._result is not _NOT_READY

    @staticmethod
    def ready(value: T) -> Pending[T]:
        """A ``Pending`` that needs no communication, so callers need no special case for it."""
        return Pending(work=None, finish=lambda: value)
