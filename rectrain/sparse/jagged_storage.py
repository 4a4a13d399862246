"""``JaggedStorage``: flat values cut into rows by lengths or offsets, the storage both jagged types share.

``JaggedTensor`` (one feature's rows) and ``KeyedJaggedTensor`` (every key's rows, key-major) keep the same
four tensors and answer the same questions about them; this one small base holds those accessors so that the
two types differ only in what their rows mean. It is a single level of sharing, not a hierarchy to extend.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.errors import RecTrainError
from rectrain.sparse import jagged_ops


class JaggedStorage:
    """``values`` (plus one weight per value, or None) in rows given by ``lengths`` or ``offsets``.

    At least one of ``lengths``/``offsets`` is set; the other is computed on first use and cached.
    """

    _values: Tensor
    _weights: Tensor | None
    _lengths: Tensor | None
    _offsets: Tensor | None

    def values(self) -> Tensor:
        return self._values

    def weights(self) -> Tensor:
        """The per-value weights; raises RecTrainError if this tensor was built without weights."""
        if self._weights is None:
            name = type(self).__name__
            raise RecTrainError(
                f"this {name} has no weights (built with weights=None); use weights_or_none()"
            )
        return self._weights

    def weights_or_none(self) -> Tensor | None:
        return self._weights

    def lengths(self) -> Tensor:
        """Per-row lengths (key-major in a KeyedJaggedTensor), computed from offsets on first use, cached."""
        if self._lengths is None:
            self._lengths = jagged_ops.offsets_to_lengths(self._offsets)
        return self._lengths

    def offsets(self) -> Tensor:
        """Per-row offsets (rows + 1 entries), computed from lengths on first use and cached."""
        if self._offsets is None:
            self._offsets = jagged_ops.lengths_to_offsets(self._lengths)
        return self._offsets

    def lengths_or_none(self) -> Tensor | None:
        return self._lengths

    def offsets_or_none(self) -> Tensor | None:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use on ``stream`` (CUDA caching allocator)."""
        for t in (self._values, self._weights, self._lengths, self._offsets):
            if t is not None:
                t.record_stream(stream)

    def size_in_bytes(self) -> int:
        """Bytes held by the tensors (values, weights, lengths and offsets, where present)."""
        tensors = (self._values, self._weights, self._lengths, self._offsets)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)
