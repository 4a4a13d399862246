"""JaggedTensor: a batch of variable-length rows, stored as flat values plus lengths or offsets.

Same API as ``torchrec.sparse.jagged_tensor.JaggedTensor``; the one behavioural difference is that the
constructor validates its input unless ``validate=False`` (see ``rectrain.sparse.validation``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.sparse import jagged_ops, validation
from rectrain.sparse.jagged_storage import JaggedStorage

_STR_MAX_ROWS = 20


class JaggedTensor(JaggedStorage):
    """Values of B rows of different lengths: row b is ``values[offsets[b]:offsets[b + 1]]``.

    Either ``lengths`` or ``offsets`` must be given; the other is computed on first use and cached.
    ``weights``, if given, holds one weight per value (e.g. per-id scores of a weighted feature).
    """

    def __init__(
        self,
        values: Tensor,
        weights: Tensor | None = None,
        lengths: Tensor | None = None,
        offsets: Tensor | None = None,
        *,
        validate: bool = True,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("JaggedTensor needs lengths or offsets (both are None)")
        if validate:
            validation.check_weights(values, weights)
            validation.check_jagged(values, lengths, offsets)
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> JaggedTensor:
        """A JaggedTensor with no rows."""
        weights = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return JaggedTensor(
            values=torch.empty(0, dtype=values_dtype, device=device),
            weights=weights,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            offsets=torch.zeros(1, dtype=lengths_dtype, device=device),
            validate=False,
        )

    @staticmethod
    def from_dense(values: list[Tensor], weights: list[Tensor] | None = None) -> JaggedTensor:
        """Concatenate a list of rows (row b is ``values[b]``) into one JaggedTensor."""
        if weights is not None and len(weights) != len(values):
            raise ValueError(f"weights has {len(weights)} rows but values has {len(values)}")
        if not values:
            return JaggedTensor.empty(is_weighted=weights is not None, lengths_dtype=torch.int64)
        device = values[0].device
        lengths = torch.tensor([v.size(0) for v in values], dtype=torch.int64, device=device)
        cat_weights = torch.cat(weights) if weights is not None else None
        return JaggedTensor(values=torch.cat(values), weights=cat_weights, lengths=lengths)

    @staticmethod
    def from_dense_lengths(values: Tensor, lengths: Tensor, weights: Tensor | None = None) -> JaggedTensor:
        """Keep the first ``lengths[b]`` entries of each row b of a dense [B, N, ...] ``values``."""
        if values.dim() < 2 or lengths.dim() != 1 or lengths.size(0) != values.size(0):
            raise ValueError(
                f"from_dense_lengths needs values of shape [B, N, ...] and lengths of shape [B]: "
                f"got values {tuple(values.shape)} and lengths {tuple(lengths.shape)}"
            )
        if weights is not None and weights.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"weights shape {tuple(weights.shape)} does not match values shape {tuple(values.shape)}"
            )
        mask = jagged_ops.dense_mask(lengths, values.size(1))
        masked_weights = weights[mask] if weights is not None else None
        return JaggedTensor(values=values[mask], weights=masked_weights, lengths=lengths)

    def to_dense(self) -> list[Tensor]:
        """The rows as a list of tensors (one host sync for the lengths)."""
        return list(torch.split(self._values, self.lengths().tolist()))

    def to_dense_weights(self) -> list[Tensor] | None:
        """The per-row weights as a list of tensors, or None if unweighted."""
        if self._weights is None:
            return None
        return list(torch.split(self._weights, self.lengths().tolist()))

    def to_padded_dense(self, desired_length: int | None = None, padding_value: float = 0.0) -> Tensor:
        """[B, N, ...] tensor of the rows padded with ``padding_value``; N = desired_length or the max length.

        Rows longer than ``desired_length`` are truncated.
        """
        return jagged_ops.to_padded_dense(
            self._values, self.offsets(), self._padded_width(desired_length), padding_value
        )

    def to_padded_dense_weights(
        self, desired_length: int | None = None, padding_value: float = 0.0
    ) -> Tensor | None:
        """Like ``to_padded_dense`` for the weights; None if unweighted."""
        if self._weights is None:
            return None
        return jagged_ops.to_padded_dense(
            self._weights, self.offsets(), self._padded_width(desired_length), padding_value
        )

    def _padded_width(self, desired_length: int | None) -> int:
        if desired_length is not None:
            if desired_length < 0:
                raise ValueError(f"desired_length must be non-negative, got {desired_length}")
            return desired_length
        lengths = self.lengths()
        return int(lengths.max()) if lengths.numel() > 0 else 0

    def to(self, device: torch.device | str, non_blocking: bool = False) -> JaggedTensor:
        """A copy on ``device`` (tensors already there are shared, as with ``Tensor.to``)."""

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device=device, non_blocking=non_blocking)

        return JaggedTensor(
            values=move(self._values),
            weights=move(self._weights),
            lengths=move(self._lengths),
            offsets=move(self._offsets),
            validate=False,
        )

    def __str__(self) -> str:
        lines = [f"    values: {_format_rows(self.lengths(), self._values)}"]
        if self._weights is not None:
            lines.append(f"    weights: {_format_rows(self.lengths(), self._weights)}")
        return "JaggedTensor({\n" + ",\n".join(lines) + "\n})"

    __repr__ = __str__


def _format_rows(lengths: Tensor, values: Tensor) -> str:
    """Rows as nested lists, e.g. ``[[1, 2], [], [3]]``, showing at most _STR_MAX_ROWS of them."""
    shown = lengths[:_STR_MAX_ROWS].tolist()
    rows = [r.tolist() for r in torch.split(values[: sum(shown)], shown)]
    text = str(rows)
    if lengths.numel() > len(shown):
        text = f"{text[:-1]}, ... ({lengths.numel() - len(shown)} more rows)]"
    return text
