"""Input distribution: send each id of a local batch to the ranks whose shards hold its row.

The sender lays its ids out as ``Routing`` segments (the selected features, then the row-split features'
buckets from FBGEMM's ``block_bucketize_sparse_features``), permutes the segments into destination-major
stream order with one ``permute_2D_sparse_data`` and sends lengths, ids and weights with one split exchange
and one all-to-all each. The receiver turns the source-major blocks it got into the feature-major layout its
FBGEMM kernel reads (one ``permute_1D_sparse_data`` for lengths, one for ids and weights). Batch sizes may
differ per rank: every source's batch size travels with the split exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.distributed.comm import ops as comm
from rectrain.distributed.comm.pending import Pending
from rectrain.distributed.routing.routes import Routing
from rectrain.embedding.feature_routing import KJTLike, feature_positions

fbgemm = torch.ops.fbgemm


@dataclass
class LocalFeatures:
    """This rank's batch restricted to the routed features: ``lengths`` is ``[num features, batch]``."""

    lengths: Tensor
    values: Tensor
    weights: Tensor | None

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[1]


@dataclass
class ShardInput:
    """What this rank's kernel looks up: FBGEMM ``indices``/``offsets`` over the global batch.

    Bags are feature-major; within a feature, source rank by source rank (``batch_size_per_rank``), which is
    also the row order of the pooled output.
    """

    indices: Tensor
    offsets: Tensor
    per_sample_weights: Tensor | None
    batch_size_per_rank: list[int]


class FeatureSelector:
    """Picks the routed features out of a KJT whose keys may come in any order and include extra keys."""

    def __init__(self, features: tuple[str, ...]) -> None:
        self.features = features
        self._orders: dict[tuple[str, ...], Tensor | None] = {}

    def _order(self, keys: list[str]) -> Tensor | None:
        cache_key = tuple(keys)
        if cache_key not in self._orders:
            order = feature_positions(keys, self.features)
            self._orders[cache_key] = (
                None if order == list(range(len(keys))) else torch.tensor(order, dtype=torch.int32)
            )
        return self._orders[cache_key]

    def __call__(self, kjt: KJTLike, weighted: bool) -> LocalFeatures:
        if kjt.variable_stride_per_key():
            raise ValueError(
                "sharded collections need one batch size for every key (variable_stride_per_key)"
            )
        keys = list(kjt.keys())
        weights = kjt.weights_or_none() if weighted else None
        if weighted and weights is None:
            raise ValueError(
                "this collection is weighted (is_weighted=True) but the KeyedJaggedTensor has no weights"
            )
        lengths = kjt.lengths().long().view(len(keys), kjt.stride())
        values = kjt.values().long()
        if weights is not None:
            weights = weights.float()
        order = self._order(keys)
        if order is not None:
            lengths, values, weights = fbgemm.permute_2D_sparse_data(
                order.to(lengths.device), lengths, values, weights
            )[:3]
        return LocalFeatures(lengths, values, weights)


def _segments(routing: Routing, local: LocalFeatures) -> tuple[Tensor, Tensor, Tensor | None]:
    """The sender's segments ``[num segments, batch]``: features, then every bucket group's buckets."""
    if not routing.bucket_groups:
        return local.lengths, local.values, local.weights
    lengths, values, weights = [local.lengths.reshape(-1)], [local.values], [local.weights]
    for group in routing.bucket_groups:
        members = torch.tensor(group.features, dtype=torch.int32, device=local.lengths.device)
        g_lengths, g_values, g_weights = fbgemm.permute_2D_sparse_data(
            members, local.lengths, local.values, local.weights
        )[:3]
        block_sizes = torch.tensor(group.block_sizes, dtype=torch.int64, device=g_values.device)
        b_lengths, b_values, b_weights = fbgemm.block_bucketize_sparse_features(
            g_lengths.reshape(-1), g_values, False, False, block_sizes, group.num_buckets, g_weights
        )[:3]
        lengths.append(b_lengths)
        values.append(b_values)
        weights.append(b_weights)
    batch = local.batch_size
    all_weights = None if local.weights is None else torch.cat(weights)
    return torch.cat(lengths).view(-1, batch), torch.cat(values), all_weights


def send_features(
    routing: Routing, local: LocalFeatures, group: dist.ProcessGroup | None
) -> Pending[tuple[Tensor, Tensor, Tensor | None, list[int]]]:
    """Start sending ``local`` to the shards; the result is what this rank receives (source-major)."""
    return send_segments(routing, *_segments(routing, local), local.batch_size, group)


def send_segments(
    routing: Routing,
    lengths: Tensor,
    values: Tensor,
    weights: Tensor | None,
    batch: int,
    group: dist.ProcessGroup | None,
) -> Pending[tuple[Tensor, Tensor, Tensor | None, list[int]]]:
    """Send ``routing``'s segments (``lengths`` ``[segments, batch]``) in stream order: one split exchange
    and one all-to-all each for lengths, values and weights; the result is ``(lengths, values, weights,
    every source's batch size)`` as received (source-major)."""
    order = [stream.segment for streams in routing.streams for stream in streams]
    if order != list(range(lengths.shape[0])):
        lengths, values, weights = fbgemm.permute_2D_sparse_data(
            torch.tensor(order, dtype=torch.int32, device=lengths.device), lengths, values, weights
        )[:3]
    if routing.world_size == 1:
        return Pending.ready((lengths.reshape(-1), values, weights, [batch]))
    per_stream = lengths.sum(dim=1)
    streams_per_rank = [len(streams) for streams in routing.streams]
    value_splits = [
        int(v) for v in torch.stack([s.sum() for s in per_stream.split(streams_per_rank)]).tolist()
    ]
    length_splits = [n * batch for n in streams_per_rank]
    recv_lengths, recv_values, recv_batches = comm.exchange_splits(
        [length_splits, value_splits, [batch] * routing.world_size], group
    )
    pendings = [
        comm.all_to_all_single(lengths.reshape(-1), recv_lengths, length_splits, group, async_op=True),
        comm.all_to_all_single(values, recv_values, value_splits, group, async_op=True),
    ]
    if weights is not None:
        pendings.append(comm.all_to_all_single(weights, recv_values, value_splits, group, async_op=True))

    def finish() -> tuple[Tensor, Tensor, Tensor | None, list[int]]:
        results = [p.wait() for p in pendings]
        return results[0], results[1], results[2] if len(results) > 2 else None, recv_batches

    # The data all-to-alls are already running; ``finish`` waits for them.
    return Pending(None, finish)


def to_shard_input(
    num_streams: int, lengths: Tensor, values: Tensor, weights: Tensor | None, batch_size_per_rank: list[int]
) -> ShardInput:
    """Reorder what arrived (source, stream, example) into the kernel's (stream, source, example) layout."""
    sources = len(batch_size_per_rank)
    if num_streams and sources > 1:
        # Segment (source q, stream k) moves to position k * sources + q.
        order = torch.tensor(
            [q * num_streams + k for k in range(num_streams) for q in range(sources)],
            dtype=torch.int32,
            device=lengths.device,
        )
        block_rows = torch.tensor(
            [b for b in batch_size_per_rank for _ in range(num_streams)], device=lengths.device
        )
        block_values = torch.cat(
            [
                blk.view(num_streams, b).sum(dim=1)
                for blk, b in zip(
                    lengths.split([num_streams * b for b in batch_size_per_rank]), batch_size_per_rank
                )
            ]
        )
        _, values, weights = fbgemm.permute_1D_sparse_data(order, block_values, values, weights)[:3]
        lengths = fbgemm.permute_1D_sparse_data(order, block_rows, lengths)[1]
    offsets = fbgemm.asynchronous_complete_cumsum(lengths)
    return ShardInput(values, offsets, weights, list(batch_size_per_rank))
