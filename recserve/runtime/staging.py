"""A checked batch's tensors to the GPU in one asynchronous copy, through reused pinned host memory.

A copy from ordinary (pageable) host memory to a GPU makes the host wait for it, and each of a batch's four
tensors (dense, ids, offsets, weights) copied on its own is a separate wait; that was most of the gap between
a predict from CPU tensors and one from tensors already on the GPU (README, GPU figures). Here the tensors are
packed into one pinned host buffer, which a single ``non_blocking`` copy moves into one device buffer, and the
batch's tensors on the device are views of it. Both buffers are kept (per thread, grown when a batch needs
more), so a steady stream of batches allocates nothing. The host buffer is refilled only once the copy from
it has finished; the device buffer is rewritten by a later copy on the same stream, which runs after
the kernels that read it.

The packing is the same on any device (``pin=False`` on a CPU stand-in, which the tests use).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
from torch import Tensor

from rectrain.sparse import KeyedJaggedTensor

_ALIGN = 64  # bytes: each tensor's view starts on a cache line (and any dtype's alignment)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _grown(size: int) -> int:
    """Buffer sizes in powers of two, so a growing stream of batches reallocates a few times at most."""
    return 1 << max(16, (size - 1).bit_length())


class _Buffers:
    """One thread's host and device buffers, and the copy that last read the host one."""

    def __init__(self) -> None:
        self.host: Tensor | None = None
        self.device: Tensor | None = None
        self.copied: torch.cuda.Event | None = None


class Staging:
    """``staging.to_device(dense, kjt)``: the same batch on ``device``, one host-to-device copy.

    Args:
        device: where the batch goes.
        pin: page-lock the host buffer (default: when ``device`` is a GPU; required for the copy to be
            asynchronous).
    """

    def __init__(self, device: torch.device | str, pin: bool | None = None) -> None:
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" if pin is None else pin
        self._local = threading.local()

    def _buffers(self, size: int) -> _Buffers:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = _Buffers()
        if buffers.copied is not None:
            buffers.copied.synchronize()  # the last copy out of the host buffer (long done: its scores
            buffers.copied = None  # were read back)
        if buffers.host is None or buffers.host.numel() < size:
            buffers.host = torch.empty(_grown(size), dtype=torch.uint8, pin_memory=self.pin)
            buffers.device = torch.empty(_grown(size), dtype=torch.uint8, device=self.device)
        return buffers

    def to_device_tensors(self, tensors: Sequence[Tensor | None]) -> list[Tensor | None]:
        """Contiguous copies of ``tensors`` (None stays None) on the device, as views of one buffer."""
        present = [t for t in tensors if t is not None]
        starts, size = [], 0
        for t in present:
            starts.append(size)
            size = _aligned(size + t.numel() * t.element_size())
        buffers = self._buffers(max(size, 1))
        assert buffers.host is not None and buffers.device is not None
        for t, start in zip(present, starts):
            nbytes = t.numel() * t.element_size()
            buffers.host[start : start + nbytes].view(t.dtype).view(t.shape).copy_(t)
        buffers.device[:size].copy_(buffers.host[:size], non_blocking=self.pin)
        if self.device.type == "cuda":
            buffers.copied = torch.cuda.Event()
            buffers.copied.record()
        moved = iter(
            buffers.device[start : start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for t, start in zip(present, starts)
        )
        return [None if t is None else next(moved) for t in tensors]

    def to_device(self, dense: Tensor, kjt: KeyedJaggedTensor) -> tuple[Tensor, KeyedJaggedTensor]:
        """``dense`` and ``kjt`` (values, offsets, weights; its per-key counts carried) on the device."""
        dense_d, values, offsets, weights = self.to_device_tensors(
            [dense, kjt.values(), kjt.offsets(), kjt.weights_or_none()]
        )
        assert dense_d is not None and values is not None and offsets is not None
        moved = KeyedJaggedTensor(
            keys=kjt.keys(),
            values=values,
            weights=weights,
            offsets=offsets,
            stride=kjt.stride(),
            length_per_key=kjt.length_per_key_or_none(),
            validate=False,
        )
        return dense_d, moved
