"""Training pipelines (``torchrec.distributed.train_pipeline``): one ``progress()`` call trains one batch.

``TrainPipelineBase`` is the plain loop: load, copy, forward, backward, step. ``TrainPipelineSparseDist``
keeps one batch ahead: while batch i runs forward and backward, batch i+1 has already been loaded, copied to
the device (pinned memory and a side stream on CUDA) and its ids are on their way to the shards (the input
all-to-all runs asynchronously in the process group's background). The math is the same, so results are
identical.

The model is called as ``model(batch)`` and returns the loss or ``(loss, anything)``. Sharded collections are
assumed to read ``batch.sparse_features`` (as DLRM and the two-tower model do); TorchRec finds this by tracing
the model, we state it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import Tensor, nn

from rectrain.distributed.comm.timeouts import collective
from rectrain.models.batch import Batch
from rectrain.sparse import KeyedJaggedTensor


class Prefetching(Protocol):
    """A sharded collection that can start the input distribution of a batch before its forward."""

    def prefetch(self, features: KeyedJaggedTensor) -> None: ...


def _loss_of(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output


def _backward(output: Any) -> None:
    # Data-parallel gradients are all-reduced by DDP's hooks inside the autograd engine, out of reach of the
    # named collectives: a hung peer would surface as gloo's bare "Timed out waiting ... for recv".
    with collective("backward (gradient all_reduce)"):
        _loss_of(output).backward()


def prefetching_modules(model: nn.Module) -> list[Prefetching]:
    """The sub-modules of ``model`` whose input distribution can start early."""
    return [m for m in model.modules() if callable(getattr(m, "prefetch", None))]


In = TypeVar("In")
Out = TypeVar("Out")


class TrainPipeline(abc.ABC, Generic[In, Out]):
    """TorchRec's pipeline interface: ``progress(dataloader_iter)`` trains on the next batch."""

    @abc.abstractmethod
    def progress(self, dataloader_iter: Iterator[In]) -> Out: ...


class TrainPipelineBase(TrainPipeline[Batch, Any]):
    """The plain loop, one batch at a time; the reference the pipelined version must match."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device

    def progress(self, dataloader_iter: Iterator[Batch]) -> Any:
        """Train on the next batch and return the model's output; StopIteration when the data ends."""
        batch = next(dataloader_iter).to(self.device)
        output = self.model(batch)
        self.optimizer.zero_grad()
        _backward(output)
        self.optimizer.step()
        return output


class TrainPipelineSparseDist(TrainPipelineBase):
    """Batch i+1's load, host-to-device copy and input all-to-all overlap batch i's forward and backward."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        super().__init__(model, optimizer, device)
        self._prefetchers = prefetching_modules(model)
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._next: Batch | None = None
        self._started = False

    def _load(self, dataloader_iter: Iterator[Batch]) -> Batch | None:
        try:
            batch = next(dataloader_iter)
        except StopIteration:
            return None
        if self._copy_stream is None:
            return batch.to(self.device)
        with torch.cuda.stream(self._copy_stream):
            return batch.pin_memory().to(self.device, non_blocking=True)

    def _ready(self, batch: Batch) -> None:
        """Make the copied batch usable on the compute stream, then start its input distribution."""
        if self._copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
            batch.record_stream(torch.cuda.current_stream(self.device))
        for module in self._prefetchers:
            module.prefetch(batch.sparse_features)

    def progress(self, dataloader_iter: Iterator[Batch]) -> Any:
        """Train on the batch loaded last time (loading and starting the next one meanwhile)."""
        if not self._started:
            self._started = True
            self._next = self._load(dataloader_iter)
            if self._next is not None:
                self._ready(self._next)
        batch = self._next
        if batch is None:
            raise StopIteration
        following = self._load(dataloader_iter)
        output = self.model(batch)
        if following is not None:
            self._ready(following)  # its ids travel while this batch runs backward
        self.optimizer.zero_grad()
        _backward(output)
        self.optimizer.step()
        self._next = following
        return output
