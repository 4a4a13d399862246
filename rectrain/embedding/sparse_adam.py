"""Fused sparse Adam for table-batched embeddings on CPU.

FBGEMM's CPU table-batched embedding (TBE) backward fuses only SGD and the Adagrad variants; its Adam is
CUDA-only. These pure functions let a TBE ``torch.autograd.Function`` run Adam inside its backward so that
no dense embedding gradient is ever materialised:

1. :func:`tbe_row_gradients` turns the output gradient (pooled ``[B, total_D]`` or sequence
   ``[num_indices, D]``) into, per table, the unique rows the batch read and their summed gradients.
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
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from rectrain.embedding.config import PoolingType
from rectrain.errors import ConfigError

if TYPE_CHECKING:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode


@dataclass(frozen=True)
class TBELayout:
    """Where each table lives in a TBE's flat weight buffer and each feature in its output.

    ``weights_offsets[t]`` is the start of table ``t`` (one per *table*; FBGEMM's ``weights_offsets``
    buffer is the per-*feature* expansion, see :attr:`feature_weights_offsets`). Table ``t`` occupies
    ``table_rows[t] * table_dims[t]`` consecutive values, row-major. Feature ``f`` reads table
    ``feature_table_map[f]``; features are laid out in order in the pooled output (:attr:`D_offsets`).
    """

    table_rows: tuple[int, ...]
    table_dims: tuple[int, ...]
    weights_offsets: tuple[int, ...]
    feature_table_map: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("table_rows", "table_dims", "weights_offsets", "feature_table_map"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        num_tables = len(self.table_rows)
        if num_tables == 0:
            raise ConfigError("TBELayout needs at least one table; table_rows is empty")
        if len(self.table_dims) != num_tables or len(self.weights_offsets) != num_tables:
            raise ConfigError(
                f"table_rows, table_dims and weights_offsets must have one entry per table; got lengths "
                f"{num_tables}, {len(self.table_dims)}, {len(self.weights_offsets)}"
            )
        for t, (rows, dim, start) in enumerate(zip(self.table_rows, self.table_dims, self.weights_offsets)):
            if rows <= 0 or dim <= 0 or start < 0:
                raise ConfigError(
                    f"table {t}: rows ({rows}) and dim ({dim}) must be > 0 and weights offset ({start}) >= 0"
                )
        bad = [t for t in self.feature_table_map if not 0 <= t < num_tables]
        if bad:
            raise ConfigError(f"feature_table_map names tables {bad}, but there are only {num_tables} tables")
        spans = sorted((start, start + rows * dim, t) for t, (rows, dim, start) in enumerate(self._tables()))
        for (_, end, t), (next_start, _, u) in zip(spans, spans[1:]):
            if next_start < end:
                raise ConfigError(f"tables {t} and {u} overlap in the weight buffer ({t} ends at {end})")

    @classmethod
    def from_tables(
        cls,
        table_rows: Sequence[int],
        table_dims: Sequence[int],
        feature_table_map: Sequence[int] | None = None,
    ) -> TBELayout:
        """Tables packed back to back in order (FBGEMM's host layout); one feature per table by default."""
        starts = [0]
        for rows, dim in zip(table_rows, table_dims):
            starts.append(starts[-1] + rows * dim)
        if feature_table_map is None:
            feature_table_map = range(len(table_rows))
        return cls(
            tuple(table_rows), tuple(table_dims), tuple(starts[: len(table_rows)]), tuple(feature_table_map)
        )

    def _tables(self) -> zip[tuple[int, int, int]]:
        return zip(self.table_rows, self.table_dims, self.weights_offsets)

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def num_features(self) -> int:
        return len(self.feature_table_map)

    @property
    def num_weights(self) -> int:
        """The smallest flat buffer length that holds every table."""
        return max(start + rows * dim for rows, dim, start in self._tables())

    @property
    def feature_dims(self) -> tuple[int, ...]:
        return tuple(self.table_dims[t] for t in self.feature_table_map)

    @property
    def D_offsets(self) -> tuple[int, ...]:  # noqa: N802 - FBGEMM's name
        """Column where each feature's block starts in the pooled output, plus the total width."""
        offsets = [0]
        for dim in self.feature_dims:
            offsets.append(offsets[-1] + dim)
        return tuple(offsets)

    @property
    def feature_weights_offsets(self) -> tuple[int, ...]:
        """FBGEMM's per-feature ``weights_offsets`` buffer: the start of each feature's table."""
        return tuple(self.weights_offsets[t] for t in self.feature_table_map)

    def table_view(self, buffer: Tensor, table: int) -> Tensor:
        """Table ``table`` of a flat buffer (weights or optimizer state) as a ``[rows, dim]`` view."""
        rows, dim, start = self.table_rows[table], self.table_dims[table], self.weights_offsets[table]
        return buffer[start : start + rows * dim].view(rows, dim)


class TableRowGrads(NamedTuple):
    """The rows of one table a batch read (local ids, sorted, unique) and their summed gradients."""

    rows: Tensor  # int64 [n]
    grads: Tensor  # [n, table_dim]


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


def _pooled_index_grads(
    grad_output: Tensor,
    offsets: Tensor,
    feature: int,
    batch_size: int,
    layout: TBELayout,
    pooling: PoolingType,
    per_sample_weights: Tensor | None,
) -> Tensor:
    """The gradient reaching each id of one feature: its bag's output gradient, scaled as pooled."""
    bag_bounds = offsets[feature * batch_size : (feature + 1) * batch_size + 1]
    lengths = bag_bounds.diff()
    lo, hi = int(bag_bounds[0]), int(bag_bounds[-1])
    bag = torch.repeat_interleave(
        torch.arange(batch_size, device=offsets.device), lengths, output_size=hi - lo
    )
    col = layout.D_offsets[feature]
    grads = grad_output[:, col : col + layout.feature_dims[feature]].index_select(0, bag)
    if per_sample_weights is not None:
        grads.mul_(per_sample_weights[lo:hi].to(grads.dtype).unsqueeze(1))
    if pooling == PoolingType.MEAN:
        # Only non-empty bags own ids, so the length is never zero here (empty bags contribute nothing).
        grads.div_(lengths.index_select(0, bag).to(grads.dtype).unsqueeze(1))
    return grads


def _coalesce(
    ids: list[Tensor], grads: list[Tensor], table: int, layout: TBELayout, like: Tensor
) -> TableRowGrads:
    """Sum the gradients of repeated ids of one table into one gradient per unique row."""
    dim = layout.table_dims[table]
    if not ids:
        return TableRowGrads(torch.empty(0, dtype=torch.int64, device=like.device), like.new_empty(0, dim))
    rows, inverse = torch.unique(torch.cat(ids).long(), sorted=True, return_inverse=True)
    first, last = int(rows[0]), int(rows[-1])
    if first < 0 or last >= layout.table_rows[table]:
        bad = first if first < 0 else last
        raise ValueError(
            f"index {bad} is out of range for table {table} with {layout.table_rows[table]} rows"
        )
    summed = like.new_zeros(rows.numel(), dim).index_add_(0, inverse, torch.cat(grads))
    return TableRowGrads(rows, summed)


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
    batch_size = _check_inputs(grad_output, indices, offsets, layout, pooling, per_sample_weights)
    table_ids: list[list[Tensor]] = [[] for _ in range(layout.num_tables)]
    table_grads: list[list[Tensor]] = [[] for _ in range(layout.num_tables)]
    feature_bounds = offsets[::batch_size].tolist() if batch_size else [0] * (layout.num_features + 1)
    for feature, table in enumerate(layout.feature_table_map):
        lo, hi = feature_bounds[feature], feature_bounds[feature + 1]
        if lo == hi:
            continue
        if pooling == PoolingType.NONE:
            grads = grad_output[lo:hi]
        else:
            grads = _pooled_index_grads(
                grad_output, offsets, feature, batch_size, layout, pooling, per_sample_weights
            )
        table_ids[table].append(indices[lo:hi])
        table_grads[table].append(grads)
    return [_coalesce(table_ids[t], table_grads[t], t, layout, grad_output) for t in range(layout.num_tables)]


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
