"""A CPU TBE lookup whose backward is an update of ours, in the TBE's own weight storage.

FBGEMM 1.8.0's CPU backward is slow (issue 13) and has no Adam; :class:`FusedUpdateLookup` is what the
native backward (``rectrain.embedding.native_backward``) and CPU Adam (``rectrain.embedding.cpu_adam``)
share: forward runs FBGEMM's CPU lookup kernel without autograd, backward hands the output's gradient to the
subclass's :meth:`~FusedUpdateLookup.apply_gradient` and returns no embedding gradient, so the update costs
only the rows the batch read, as with FBGEMM's fused optimizers.
"""

from __future__ import annotations

from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import Tensor

from rectrain.embedding.tbe_layout import TBELayout


def tbe_layout(tbe: SplitTableBatchedEmbeddingBagsCodegen) -> TBELayout:
    """The table layout of a CPU TBE's flat ``weights_host`` buffer, read from the TBE itself."""
    rows_and_dims = [(int(spec[0]), int(spec[1])) for spec in tbe.embedding_specs]
    feature_table_map = list(tbe.feature_table_map)
    feature_offsets = tbe.weights_offsets.tolist()
    table_offsets = [feature_offsets[feature_table_map.index(t)] for t in range(len(rows_and_dims))]
    return TBELayout(
        table_rows=tuple(rows for rows, _ in rows_and_dims),
        table_dims=tuple(dim for _, dim in rows_and_dims),
        weights_offsets=tuple(table_offsets),
        feature_table_map=tuple(feature_table_map),
    )


class _LookupFunction(torch.autograd.Function):
    """Forward: the TBE's lookup without autograd. Backward: the owner's update, no gradient out."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        placeholder: Tensor,
        lookup: FusedUpdateLookup,
        indices: Tensor,
        offsets: Tensor,
        per_sample_weights: Tensor | None,
    ) -> Tensor:
        ctx.lookup = lookup
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        # The TBE's own backward must never fire: run its forward without autograd.
        with torch.no_grad():
            return lookup.tbe(indices, offsets, per_sample_weights)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[None, ...]:  # type: ignore[override]
        indices, offsets, per_sample_weights = ctx.saved_tensors
        ctx.lookup.apply_gradient(grad_output, indices, offsets, per_sample_weights)
        return (None, None, None, None, None)


class FusedUpdateLookup:
    """A CPU TBE's lookup whose backward calls :meth:`apply_gradient` (implemented by subclasses)."""

    def __init__(self, tbe: SplitTableBatchedEmbeddingBagsCodegen) -> None:
        self.tbe = tbe
        self.layout = tbe_layout(tbe)
        # Autograd only calls backward for functions with an input that requires grad.
        self._placeholder = torch.zeros(0, requires_grad=True)

    def __call__(self, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None = None) -> Tensor:
        return _LookupFunction.apply(self._placeholder, self, indices, offsets, per_sample_weights)

    def apply_gradient(
        self, grad_output: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None
    ) -> None:
        """Update the rows ``indices`` read, given the gradient of the lookup's output."""
        raise NotImplementedError
