"""JaggedTensor: one feature's batch of variable-length rows, stored as flat values plus lengths or offsets.

Same API and behaviour as ``torchrec.sparse.jagged_tensor.JaggedTensor``: the constructor stores what it is
given (values may be 2-D, may run past the last row; nothing tensor-valued is read), the class is
``torch.jit.script``-able, ``torch.fx`` records its construction from traced values as one node
(``JaggedTensorMeta``), and ``validate()`` checks the data where it enters.
"""

import abc

import torch
from torch import Tensor

from rectrain.errors import RecTrainError
from rectrain.sparse import formatting, jagged_ops, validation


class JaggedTensorMeta(abc.ABCMeta, torch.fx._symbolic_trace.ProxyableClassMeta):
    """Lets ``torch.fx`` record the construction of a sparse type from traced values as a graph node."""

    def __call__(cls, *args, **kwargs):
        # Outside fx symbolic tracing construct directly (torch's check would log a warning per process).
        if not torch.fx._symbolic_trace.is_fx_symbolic_tracing():
            instance = cls.__new__(cls)
            cls.__init__(instance, *args, **kwargs)
            return instance
        return super().__call__(*args, **kwargs)


@torch.fx.wrap
def _arange_like_rows(values: Tensor) -> Tensor:
    """[B, N] column positions of a dense [B, N, ...] tensor (a leaf for ``torch.fx``)."""
    return torch.arange(values.size(1), device=values.device).expand(values.size(0), -1)


@torch.fx.wrap
def _optional_mask(tensor: Tensor | None, mask: Tensor) -> Tensor | None:
    return tensor[mask] if tensor is not None else None


def _weights_or_throw(weights: Tensor | None) -> Tensor:
    if weights is None:
        raise RecTrainError(
            "this (Keyed)JaggedTensor has no weights (built with weights=None); use weights_or_none()"
        )
    return weights


class JaggedTensor(metaclass=JaggedTensorMeta):
    """Values of B rows of different lengths: row b is ``values[offsets[b]:offsets[b + 1]]``.

    Args:
        values: the flat values (1-D ids, or [N, D] rows).
        weights: one weight per value (e.g. per-id scores of a weighted feature), or None.
        lengths: [B] row lengths; computed from ``offsets`` on first use when not given.
        offsets: [B + 1] row offsets; computed from ``lengths`` on first use when not given.
        validate: None (default): TorchRec's construction checks only (integer lengths/offsets; everything
            under ``debug_checks``); True: also ``validate()`` now; False: no check at all (for callers
            that check the data themselves).
    """

    def __init__(
        self,
        values: Tensor,
        weights: Tensor | None = None,
        lengths: Tensor | None = None,
        offsets: Tensor | None = None,
        validate: bool | None = None,
    ) -> None:
        self._values: Tensor = values
        self._weights: Tensor | None = weights
        if offsets is None and lengths is None:
            raise ValueError("JaggedTensor needs lengths or offsets (both are None)")
        self._lengths: Tensor | None = lengths
        self._offsets: Tensor | None = offsets
        if not torch.jit.is_scripting():
            validation.construction_checks(self, validate)

    @torch.jit.unused
    def validate(self) -> "JaggedTensor":
        """Raise ValueError naming the problem unless lengths/offsets partition the values; returns self."""
        validation.validate_jagged_tensor(self)
        return self

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "JaggedTensor":
        """A JaggedTensor with no rows (empty values, lengths and offsets)."""
        weights = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return JaggedTensor(
            values=torch.empty(0, dtype=values_dtype, device=device),
            offsets=torch.empty(0, dtype=lengths_dtype, device=device),
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            weights=weights,
        )

    @staticmethod
    def empty_like(jt: "JaggedTensor", device: torch.device | None = None) -> "JaggedTensor":
        """No rows but ``jt``'s dtypes; with ``device``, uninitialised tensors of ``jt``'s shapes there."""
        if device is None:
            weights = jt.weights_or_none()
            return JaggedTensor(
                values=torch.empty(0, device=jt.device(), dtype=jt.values().dtype),
                weights=None if weights is None else torch.empty(0, device=jt.device(), dtype=weights.dtype),
                lengths=torch.empty(0, device=jt.device(), dtype=jt.lengths().dtype),
            )
        return JaggedTensor(
            values=torch.empty_like(jt.values(), device=device),
            weights=_empty_like_or_none(jt.weights_or_none(), device),
            lengths=_empty_like_or_none(jt.lengths_or_none(), device),
            offsets=_empty_like_or_none(jt.offsets_or_none(), device),
        )

    def copy_(self, jt: "JaggedTensor", non_blocking: bool = False) -> "JaggedTensor":
        """Copy ``jt``'s tensors into this one's, in place (shapes must match); returns self."""
        self._values.copy_(jt._values, non_blocking=non_blocking)
        _copy_if_both(self._weights, jt._weights, non_blocking)
        _copy_if_both(self._lengths, jt._lengths, non_blocking)
        _copy_if_both(self._offsets, jt._offsets, non_blocking)
        return self

    @staticmethod
    def from_dense_lengths(values: Tensor, lengths: Tensor, weights: Tensor | None = None) -> "JaggedTensor":
        """Keep the first ``lengths[b]`` entries of each row b of a dense [B, N, ...] ``values``."""
        mask = _arange_like_rows(values) < lengths.unsqueeze(-1)
        return JaggedTensor(values=values[mask], weights=_optional_mask(weights, mask), lengths=lengths)

    @staticmethod
    def from_dense(values: list[Tensor], weights: list[Tensor] | None = None) -> "JaggedTensor":
        """Concatenate a list of rows (row b is ``values[b]``) into one JaggedTensor (int32 lengths)."""
        if len(values) == 0:  # no rows (TorchRec's torch.cat would raise)
            empty = torch.empty(0)
            return JaggedTensor(
                empty, empty if weights is not None else None, torch.empty(0, dtype=torch.int32)
            )
        values_tensor = torch.cat(values, dim=0)
        lengths = torch.tensor(
            [value.size(0) for value in values], dtype=torch.int32, device=values_tensor.device
        )
        weights_tensor = torch.cat(weights, dim=0) if weights is not None else None
        return JaggedTensor(values=values_tensor, weights=weights_tensor, lengths=lengths)

    def to_dense(self) -> list[Tensor]:
        """The rows as a list of views of ``values`` (one host sync for the offsets)."""
        return _rows(self._values, self.offsets())

    def to_dense_weights(self) -> list[Tensor] | None:
        """The per-row weights as a list of views, or None if unweighted."""
        weights = self._weights
        if weights is None:
            return None
        return _rows(weights, self.offsets())

    def to_padded_dense(self, desired_length: int | None = None, padding_value: float = 0.0) -> Tensor:
        """[B, N, ...] tensor of the rows padded with ``padding_value``; N = desired_length or the longest
        row. Rows longer than ``desired_length`` are truncated."""
        width = self._padded_width(desired_length)
        return jagged_ops.to_padded_dense(self._values, self.offsets(), width, padding_value)

    def to_padded_dense_weights(
        self, desired_length: int | None = None, padding_value: float = 0.0
    ) -> Tensor | None:
        """Like ``to_padded_dense`` for the weights; None if unweighted."""
        weights = self._weights
        if weights is None:
            return None
        width = self._padded_width(desired_length)
        return jagged_ops.to_padded_dense(weights, self.offsets(), width, padding_value)

    def _padded_width(self, desired_length: int | None) -> int:
        if desired_length is not None:
            return desired_length
        lengths = self.lengths()
        return int(torch.max(lengths).item()) if lengths.numel() > 0 else 0

    def device(self) -> torch.device:
        return self._values.device

    def lengths(self) -> Tensor:
        """Row lengths, computed from offsets on first use and cached."""
        lengths = jagged_ops.lengths_or_computed(self._lengths, self._offsets)
        self._lengths = lengths
        return lengths

    def lengths_or_none(self) -> Tensor | None:
        return self._lengths

    def offsets(self) -> Tensor:
        """Row offsets (rows + 1 entries), computed from lengths on first use and cached."""
        offsets = jagged_ops.offsets_or_computed(self._lengths, self._offsets)
        self._offsets = offsets
        return offsets

    def offsets_or_none(self) -> Tensor | None:
        return self._offsets

    def values(self) -> Tensor:
        return self._values

    def weights(self) -> Tensor:
        """The per-value weights; RecTrainError if this tensor was built without weights."""
        return _weights_or_throw(self._weights)

    def weights_or_none(self) -> Tensor | None:
        return self._weights

    def size_in_bytes(self) -> int:
        """Bytes held by the tensors (values, weights, lengths and offsets, where present)."""
        return (
            _nbytes(self._values) + _nbytes(self._weights) + _nbytes(self._lengths) + _nbytes(self._offsets)
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> "JaggedTensor":
        """A copy on ``device`` (tensors already there are shared, as with ``Tensor.to``)."""
        return JaggedTensor(
            values=self._values.to(device, non_blocking=non_blocking),
            weights=_to_or_none(self._weights, device, non_blocking),
            lengths=_to_or_none(self._lengths, device, non_blocking),
            offsets=_to_or_none(self._offsets, device, non_blocking),
            validate=None,  # TorchScript applies no defaults to a class's own constructor in its methods
        )

    @torch.jit.unused
    def pin_memory(self) -> "JaggedTensor":
        """A copy in pinned host memory (for asynchronous host-to-device copies)."""
        pinned = [
            None if t is None else t.pin_memory() for t in (self._weights, self._lengths, self._offsets)
        ]
        return JaggedTensor(self._values.pin_memory(), pinned[0], pinned[1], pinned[2])

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use on ``stream`` (CUDA caching allocator)."""
        for tensor in (self._values, self._weights, self._lengths, self._offsets):
            if tensor is not None:
                tensor.record_stream(stream)

    @torch.jit.unused
    def __str__(self) -> str:
        return formatting.jagged_text(self._values, self._weights, self.offsets())

    @torch.jit.unused
    def __repr__(self) -> str:
        return self.__str__()


def _rows(values: Tensor, offsets: Tensor) -> list[Tensor]:
    bounds: list[int] = offsets.tolist()
    return [values[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def _nbytes(tensor: Tensor | None) -> int:
    return 0 if tensor is None else tensor.element_size() * tensor.numel()


def _to_or_none(tensor: Tensor | None, device: torch.device, non_blocking: bool) -> Tensor | None:
    return None if tensor is None else tensor.to(device, non_blocking=non_blocking)


def _empty_like_or_none(tensor: Tensor | None, device: torch.device) -> Tensor | None:
    return None if tensor is None else torch.empty_like(tensor, device=device)


def _copy_if_both(dst: Tensor | None, src: Tensor | None, non_blocking: bool) -> None:
    if dst is not None and src is not None:
        dst.copy_(src, non_blocking=non_blocking)
