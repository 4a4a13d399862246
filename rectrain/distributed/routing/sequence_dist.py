"""Sequence (per-id) distribution: ids go to their shards, each id's row comes back to its original position.

The ids travel exactly as for pooled collections (``Routing`` segments, one permute, one all-to-all), except
that row-split features are bucketised with ``sequence=True`` so FBGEMM also returns the
``unbucketize_permute`` that puts rows back in the original id order. On the way back nothing is pooled: a
shard returns one row per id it received, to the rank that sent it, in the order received. Rows of different
widths (tables of different dims, column shards) travel flattened in one variable all-to-all, and the sender
cuts them into per-stream ``[ids, cols]`` pieces, then places them per output key:

  table-wise   the stream's rows are the output;
  column-wise  the column shards' rows side by side (dim 1);
  row-wise     the buckets' rows concatenated, then ``index_select(unbucketize_permute)``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from rectrain.distributed.comm import ops as comm
from rectrain.distributed.comm.pending import Pending
from rectrain.distributed.routing.input_dist import LocalFeatures, send_segments
from rectrain.distributed.routing.routes import Routing, build_routing
from rectrain.embedding.config import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig
from rectrain.embedding.layout import group_tables
from rectrain.planner.types import ParameterSharding

fbgemm = torch.ops.fbgemm


def _convert(table: BaseEmbeddingConfig, cls: type) -> BaseEmbeddingConfig:
    return cls(
        num_embeddings=table.num_embeddings,
        embedding_dim=table.embedding_dim,
        name=table.name,
        data_type=table.data_type,
        feature_names=list(table.feature_names),
        weight_init_max=table.get_weight_init_max(),
        weight_init_min=table.get_weight_init_min(),
    )


def build_sequence_routing(
    tables: Sequence[EmbeddingConfig], shardings: Mapping[str, ParameterSharding], world_size: int
) -> Routing:
    """``build_routing`` for sequence tables; each rank's shards are ordered by (dim, data type) groups.

    FBGEMM's sequence kernel needs one dim per TBE, so a rank's shards are reordered into contiguous
    (dim, data type) groups, streams with them: the kernel then reads contiguous runs of streams.
    ``shard_tables`` hold ``EmbeddingConfig``s.
    """
    routing = build_routing([_convert(t, EmbeddingBagConfig) for t in tables], shardings, world_size)
    all_streams, all_tables = [], []
    for rank_streams, rank_tables in zip(routing.streams, routing.shard_tables):
        starts = [0]
        for table in rank_tables:
            starts.append(starts[-1] + table.num_features)
        order = [
            i for g in group_tables(rank_tables, key=lambda t: (t.embedding_dim, t.data_type)) for i in g
        ]
        all_tables.append(tuple(_convert(rank_tables[i], EmbeddingConfig) for i in order))
        all_streams.append(tuple(s for i in order for s in rank_streams[starts[i] : starts[i + 1]]))
    return replace(routing, streams=tuple(all_streams), shard_tables=tuple(all_tables))


def transpose_blocks(flat: Tensor, sizes: Sequence[Sequence[int]]) -> Tensor:
    """``flat`` holds blocks ``(a, b)`` of ``sizes[a][b]`` elements in (a, b) order; return them in (b, a)
    order. Differentiable (split and cat)."""
    pieces = flat.split([n for row in sizes for n in row])
    inner = len(sizes[0]) if sizes else 0
    return torch.cat([pieces[a * inner + b] for b in range(inner) for a in range(len(sizes))])


def sequence_segments(routing: Routing, local: LocalFeatures) -> tuple[Tensor, Tensor, list[Tensor]]:
    """The sender's segments ``[num segments, batch]``, their ids, each bucket group's unbucketize permute."""
    lengths, values, unbucketize = [local.lengths.reshape(-1)], [local.values], []
    for group in routing.bucket_groups:
        members = torch.tensor(group.features, dtype=torch.int32, device=local.lengths.device)
        g_lengths, g_values = fbgemm.permute_2D_sparse_data(members, local.lengths, local.values, None)[:2]
        block_sizes = torch.tensor(group.block_sizes, dtype=torch.int64, device=g_values.device)
        b_lengths, b_values, _, _, permute = fbgemm.block_bucketize_sparse_features(
            g_lengths.reshape(-1), g_values, False, True, block_sizes, group.num_buckets, None
        )
        lengths.append(b_lengths)
        values.append(b_values)
        unbucketize.append(permute)
    return torch.cat(lengths).view(-1, local.batch_size), torch.cat(values), unbucketize


@dataclass
class SentIds:
    """What the sender must remember to take its rows back: ids sent per stream (send order)."""

    ids_per_stream: list[int]
    unbucketize: list[Tensor]


def send_ids(
    routing: Routing, local: LocalFeatures, group: dist.ProcessGroup | None
) -> tuple[SentIds, Pending[tuple[Tensor, Tensor, list[int]]]]:
    """Start sending ``local``'s ids to the shards; the pending result is what arrives (source-major)."""
    seg_lengths, seg_values, unbucketize = sequence_segments(routing, local)
    per_segment = seg_lengths.sum(dim=1).tolist()
    ids_per_stream = [per_segment[stream.segment] for streams in routing.streams for stream in streams]
    sent = send_segments(routing, seg_lengths, seg_values, None, local.batch_size, group)

    def finish() -> tuple[Tensor, Tensor, list[int]]:
        lengths, values, _, batches = sent.wait()
        return lengths, values, batches

    return SentIds(ids_per_stream, unbucketize), Pending(None, finish)


def ids_per_source(lengths: Tensor, num_streams: int, batch_size_per_rank: list[int]) -> list[list[int]]:
    """``[source][stream]`` id counts of what arrived (lengths: source-major ``[streams, batch]`` blocks)."""
    if not num_streams:
        return [[] for _ in batch_size_per_rank]
    blocks = lengths.split([num_streams * b for b in batch_size_per_rank])
    sums = torch.stack([blk.view(num_streams, b).sum(dim=1) for blk, b in zip(blocks, batch_size_per_rank)])
    return sums.tolist()


def return_rows(
    rows: list[Tensor],
    stream_dims: list[int],
    counts: list[list[int]],
    dims_sent: list[int],
    group: dist.ProcessGroup | None,
    device: torch.device,
) -> Tensor:
    """Send the kernel's rows back to their senders; return the rows this rank gets back, flattened.

    ``rows``: the kernel's outputs, stream-major then source (its (dim) groups in stream order).
    ``counts[q][k]``: ids from source q on stream k. ``dims_sent[r]``: elements this rank gets from rank r.
    """
    flat = (
        torch.cat([r.reshape(-1) for r in rows])
        if rows
        else torch.zeros(0, device=device, requires_grad=True)
    )
    elements = [[counts[q][k] * d for q in range(len(counts))] for k, d in enumerate(stream_dims)]
    if elements:
        flat = transpose_blocks(flat, elements)
    send_splits = [sum(counts[q][k] * d for k, d in enumerate(stream_dims)) for q in range(len(counts))]
    return comm.all_to_all_single(flat, dims_sent, send_splits, group)


class SequenceAssembler:
    """Places the rows that came back into per-output-key ``[ids, dim]`` tensors (see module docstring)."""

    def __init__(self, routing: Routing) -> None:
        self.routing = routing
        starts = [0]
        for dim in routing.embedding_dims:
            starts.append(starts[-1] + dim)
        self._streams = [s for streams in routing.streams for s in streams]
        self.widths = [s.num_cols for s in self._streams]
        # (segment, output key index, first column) of each stream, in send order.
        self._places = []
        for s in self._streams:
            key = bisect.bisect_right(starts, s.out_col) - 1
            self._places.append((s.segment, key, s.out_col - starts[key]))
        by_segment = {segment: (i, key) for i, (segment, key, _) in enumerate(self._places)}
        # Per bucket group: for each bucket-major segment, its stream (or None), and each member's output key.
        self._buckets: list[tuple[list[int | None], list[int]]] = []
        segment = len(routing.features)
        for group in routing.bucket_groups:
            members = len(group.features)
            segments = range(segment, segment + group.num_buckets * members)
            streams = [by_segment[s][0] if s in by_segment else None for s in segments]
            keys = [by_segment[segment + j][1] for j in range(members)]
            self._buckets.append((streams, keys))
            segment += group.num_buckets * members

    def dims_from(self, ids_per_stream: list[int]) -> list[int]:
        """Elements this rank gets back from each rank for the ids it sent."""
        sizes, first = [], 0
        for streams in self.routing.streams:
            last = first + len(streams)
            sizes.append(sum(n * w for n, w in zip(ids_per_stream[first:last], self.widths[first:last])))
            first = last
        return sizes

    def assemble(self, flat: Tensor, sent: SentIds, ids_per_feature: list[int]) -> list[Tensor]:
        """Per output key (routing order), ``[ids, dim]`` rows in the local ids' order."""
        pieces = flat.split([n * w for n, w in zip(sent.ids_per_stream, self.widths)])
        rows = [p.view(n, w) for p, n, w in zip(pieces, sent.ids_per_stream, self.widths)]
        columns: list[list[tuple[int, Tensor]]] = [[] for _ in self.routing.embedding_dims]
        for (segment, key, col), r in zip(self._places, rows):
            if segment < len(self.routing.features):
                columns[key].append((col, r))
        for group, (streams, keys), permute in zip(
            self.routing.bucket_groups, self._buckets, sent.unbucketize
        ):
            dims = [self.routing.embedding_dims[k] for k in keys]
            width = max(dims)
            padded = [
                flat.new_zeros(0, width) if i is None else F.pad(rows[i], (0, width - self.widths[i]))
                for i in streams
            ]
            ordered = torch.cat(padded).index_select(0, permute)
            per_member = ordered.split([ids_per_feature[f] for f in group.features])
            for key, dim, member_rows in zip(keys, dims, per_member):
                columns[key].append((0, member_rows[:, :dim]))
        return [
            parts[0][1]
            if len(parts) == 1
            else torch.cat([r for _, r in sorted(parts, key=lambda p: p[0])], 1)
            for parts in columns
        ]
