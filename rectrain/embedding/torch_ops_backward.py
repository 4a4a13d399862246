"""The torch-ops form of the CPU fused backward: the fallback where the compiled kernel cannot run.

Used by ``rectrain.embedding.native_backward`` when numba is not importable (``cpu_kernel.available()``).
Per table (or for all tables at once when they share one dim):

1. sort the ids the batch read (``torch.sort``) and segment them (``unique_consecutive``);
2. sum each unique row's gradient with ``embedding_bag`` over the output gradient: the "embedding table" is
   the table's ``[features * batch, dim]`` block of ``grad_output``, each unique row a bag of the (sample,
   feature) positions that read it, with the pooling scale (per-sample weight, 1/length for MEAN) as the
   per-sample weight;
3. apply the optimizer to exactly those rows of the TBE's weight and state storage, in place.

Measured (bench/embedding_bag.py, 2-core AVX-512 Xeon): about 3.5x slower than FBGEMM's own backward, and
about 3x under emulated AVX2 — several full passes over the ``[unique rows, dim]`` gradients where the
compiled kernel makes one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from rectrain.embedding.config import EmbOptimType, PoolingType
from rectrain.embedding.sparse_adam import TBELayout


class RowGrads(NamedTuple):
    """The unique rows (local ids, sorted) of one table a batch read and their summed gradients."""

    rows: Tensor
    grads: Tensor


def _feature_scales(
    offsets: Tensor, lo_bag: int, batch: int, pooling: PoolingType, weights: Tensor | None, lo: int, hi: int
) -> Tensor | None:
    """Per id of one feature, the factor its bag's gradient is scaled by (None: all ones): the per-sample
    weight, divided by the bag's length under MEAN (the true gradient of FBGEMM's weighted MEAN forward)."""
    if pooling is not PoolingType.MEAN:
        return None if weights is None else weights[lo:hi].float()
    lengths = offsets[lo_bag : lo_bag + batch + 1].diff()
    inv = torch.repeat_interleave(lengths.clamp(min=1).float().reciprocal(), lengths, output_size=hi - lo)
    return inv if weights is None else inv.mul_(weights[lo:hi].float())


def table_row_grads(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Tensor,
    layout: TBELayout,
    pooling: PoolingType,
    per_sample_weights: Tensor | None,
) -> list[RowGrads | None]:
    """Per table, the unique rows read and their gradients summed over repeats (None: table not read).

    ``grad_output`` is ``[B, total_D]`` (pooled) or ``[num ids, D]`` (sequence, ``PoolingType.NONE``).
    """
    num_features = layout.num_features
    batch = (offsets.numel() - 1) // num_features
    bounds = offsets[::batch].tolist() if batch else [0] * (num_features + 1)
    result: list[RowGrads | None] = []
    for table in range(layout.num_tables):
        features = [f for f, t in enumerate(layout.feature_table_map) if t == table]
        features = [f for f in features if bounds[f + 1] > bounds[f]]
        if not features:
            result.append(None)
            continue
        result.append(
            _one_table(grad_output, indices, offsets, layout, pooling, per_sample_weights, features)
        )
    return result


def _one_table(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Tensor,
    layout: TBELayout,
    pooling: PoolingType,
    per_sample_weights: Tensor | None,
    features: list[int],
) -> RowGrads:
    num_features = layout.num_features
    batch = (offsets.numel() - 1) // num_features
    bounds = offsets[::batch].tolist()
    ids, sources, scales, blocks = [], [], [], []
    for k, f in enumerate(features):
        lo, hi = bounds[f], bounds[f + 1]
        ids.append(indices[lo:hi])
        if pooling is PoolingType.NONE:
            blocks.append(grad_output[lo:hi])
            sources.append(torch.arange(hi - lo) + sum(b.shape[0] for b in blocks[:-1]))
            scales.append(None)
            continue
        col, dim = layout.D_offsets[f], layout.feature_dims[f]
        blocks.append(grad_output[:, col : col + dim])
        lengths = offsets[f * batch : (f + 1) * batch + 1].diff()
        sources.append(
            torch.repeat_interleave(torch.arange(k * batch, (k + 1) * batch), lengths, output_size=hi - lo)
        )
        scales.append(_feature_scales(offsets, f * batch, batch, pooling, per_sample_weights, lo, hi))
    source_table = blocks[0].contiguous() if len(blocks) == 1 else torch.cat(blocks)
    all_ids = ids[0] if len(ids) == 1 else torch.cat(ids)
    source = sources[0] if len(sources) == 1 else torch.cat(sources)
    scale = _cat_scales(scales, [i.numel() for i in ids])
    sorted_ids, order = torch.sort(all_ids.long())
    rows, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    bag_offsets = torch.zeros(rows.numel(), dtype=torch.int64)
    torch.cumsum(counts[:-1], 0, out=bag_offsets[1:])
    grads = torch.nn.functional.embedding_bag(
        source.index_select(0, order),
        source_table,
        bag_offsets,
        mode="sum",
        per_sample_weights=None if scale is None else scale.index_select(0, order),
    )
    return RowGrads(rows, grads)


def uniform_dim(layout: TBELayout) -> int | None:
    """The dim every table shares if the TBE's tables can be addressed as one ``[total rows, dim]`` block."""
    dims = set(layout.table_dims)
    if len(dims) != 1:
        return None
    dim = dims.pop()
    starts = [0]
    for rows in layout.table_rows[:-1]:
        starts.append(starts[-1] + rows * dim)
    return dim if tuple(starts) == layout.weights_offsets else None


def batched_row_grads(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Tensor,
    layout: TBELayout,
    pooling: PoolingType,
    per_sample_weights: Tensor | None,
) -> RowGrads:
    """All tables at once (they share one dim): unique *global* rows (table start row + id) and gradients.

    One sort, one segmented reduction and later one update over every table keep each op large enough to
    run on all threads, instead of a loop of small per-table ops.
    """
    num_features = layout.num_features
    batch = (offsets.numel() - 1) // num_features
    num_ids = indices.numel()
    dim = layout.table_dims[0]
    row_starts = torch.tensor([0, *layout.table_rows], dtype=torch.int64).cumsum(0)[:-1]
    feature_start = row_starts[torch.tensor(layout.feature_table_map, dtype=torch.int64)]
    lengths = offsets.diff()
    bag = torch.repeat_interleave(torch.arange(num_features * batch), lengths, output_size=num_ids)
    feature = bag.div(batch, rounding_mode="floor") if batch else bag
    keys = indices.long() + feature_start.index_select(0, feature)
    scale: Tensor | None = None
    if pooling is PoolingType.NONE:
        source, source_table = torch.arange(num_ids), grad_output
    else:
        # Pooled output [B, F * D] viewed as [B * F, D]: sample b's block of feature f is row b * F + f.
        source = (bag - feature * batch).mul_(num_features).add_(feature)
        source_table = grad_output.reshape(batch * num_features, dim)
        if pooling is PoolingType.MEAN:
            scale = lengths.clamp(min=1).float().reciprocal().index_select(0, bag)
        if per_sample_weights is not None:
            weights = per_sample_weights.float()
            scale = weights if scale is None else scale.mul_(weights)
    sorted_keys, order = torch.sort(keys)
    rows, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    bag_offsets = torch.zeros(rows.numel(), dtype=torch.int64)
    torch.cumsum(counts[:-1], 0, out=bag_offsets[1:])
    grads = torch.nn.functional.embedding_bag(
        source.index_select(0, order),
        source_table,
        bag_offsets,
        mode="sum",
        per_sample_weights=None if scale is None else scale.index_select(0, order),
    )
    return RowGrads(rows, grads)


def _cat_scales(scales: list[Tensor | None], sizes: list[int]) -> Tensor | None:
    if all(s is None for s in scales):
        return None
    return torch.cat([torch.ones(n) if s is None else s for s, n in zip(scales, sizes)])


@torch.no_grad()
def apply_update_(
    optimizer: EmbOptimType,
    weights: Tensor,
    state: Tensor | None,
    rows: Tensor,
    grads: Tensor,
    lr: float,
    eps: float,
) -> None:
    """FBGEMM's fused update of ``rows`` (unique) of one table's ``[rows, dim]`` weight and state views."""
    # Rows are unique, so gather-update-scatter (index_copy_) equals index_add_ and is several times faster.
    current = weights.index_select(0, rows)
    if optimizer is EmbOptimType.SGD:
        weights.index_copy_(0, rows, current.add_(grads, alpha=-lr))
        return
    assert state is not None
    if optimizer is EmbOptimType.ROWWISE_ADAGRAD:
        mean_square = torch.linalg.vector_norm(grads, dim=1).square_().div_(grads.shape[1])
        moment = state.index_select(0, rows).view(-1).add_(mean_square)
        state.index_copy_(0, rows, moment.view(-1, 1))
        step = moment.sqrt_().add_(eps).reciprocal_().mul_(-lr).unsqueeze(1)
    else:
        moment = state.index_select(0, rows).addcmul_(grads, grads)
        state.index_copy_(0, rows, moment)
        step = moment.sqrt_().add_(eps).reciprocal_().mul_(-lr)
    weights.index_copy_(0, rows, current.add_(grads.mul_(step)))


def _table_states(tbe: Any, optimizer: EmbOptimType, num_tables: int) -> list[Tensor | None]:
    if optimizer is EmbOptimType.SGD:
        return [None] * num_tables
    states = [per_table[0] for per_table in tbe.split_optimizer_states()]
    return [s.view(s.shape[0], -1) for s in states]


def _flat_state(tbe: Any, optimizer: EmbOptimType, dim: int) -> Tensor | None:
    """The TBE's state as one ``[total rows, 1 or dim]`` block (FBGEMM packs it table after table)."""
    if optimizer is EmbOptimType.SGD:
        return None
    state = tbe.momentum1_host
    return state.view(-1, 1) if optimizer is EmbOptimType.ROWWISE_ADAGRAD else state.view(-1, dim)


@torch.no_grad()
def torch_ops_update_(
    tbe: Any,
    layout: TBELayout,
    optimizer: EmbOptimType,
    pooling: PoolingType,
    eps: float,
    inputs: tuple[Tensor, Tensor, Tensor, Tensor | None],
) -> None:
    """The fused update of a CPU TBE's weights and ``momentum1`` from ``(grad_output, indices, offsets,
    per_sample_weights)``, with torch ops."""
    grad_output, indices, offsets, per_sample_weights = inputs
    lr = tbe.get_learning_rate()
    grad_output = grad_output.float()
    dim = uniform_dim(layout)
    if dim is not None:
        rows, grads = batched_row_grads(grad_output, indices, offsets, layout, pooling, per_sample_weights)
        if rows.numel():
            weights = tbe.weights_host.view(-1, dim)
            apply_update_(optimizer, weights, _flat_state(tbe, optimizer, dim), rows, grads, lr, eps)
        return
    per_table = table_row_grads(grad_output, indices, offsets, layout, pooling, per_sample_weights)
    states = _table_states(tbe, optimizer, layout.num_tables)
    for table, row_grads in enumerate(per_table):
        if row_grads is not None:
            weights = layout.table_view(tbe.weights_host, table)
            apply_update_(optimizer, weights, states[table], row_grads.rows, row_grads.grads, lr, eps)
