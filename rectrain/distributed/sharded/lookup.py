"""Run the FBGEMM kernels of a rank's tables over a feature-major global batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from rectrain.distributed.routing.input_dist import ShardInput
from rectrain.embedding.fused_tables import FusedTables


def kernel_inputs(
    tables: FusedTables, shard_input: ShardInput
) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
    """Per kernel, ``(ids, offsets, weights)`` of its contiguous run of features, offsets from 0."""
    total = sum(shard_input.batch_size_per_rank)
    bounds = shard_input.offsets[::total].tolist() if total else None
    weights, first = shard_input.per_sample_weights, 0
    for batch in tables.batches:
        last = first + len(batch.feature_names)
        lo, hi = (bounds[first], bounds[last]) if bounds else (0, 0)
        offsets = shard_input.offsets[first * total : last * total + 1]
        yield (
            shard_input.indices[lo:hi],
            offsets - lo if lo else offsets,
            None if weights is None else weights[lo:hi],
        )
        first = last


def lookup(tables: FusedTables | None, shard_input: ShardInput, device: torch.device) -> Tensor:
    """``[global batch, sum of feature dims]``: each kernel takes its contiguous run of features."""
    if tables is None:
        # A rank without shards still joins the output all-to-all (with zero columns).
        total = sum(shard_input.batch_size_per_rank)
        return torch.zeros(total, 0, device=device, requires_grad=True)
    if len(tables.batches) == 1:
        # One kernel reads every feature: no id bounds to find (reading them would wait for a GPU).
        return tables.batches[0](shard_input.indices, shard_input.offsets, shard_input.per_sample_weights)
    outputs = [batch(*inputs) for batch, inputs in zip(tables.batches, kernel_inputs(tables, shard_input))]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def sequence_lookup(tables: FusedTables | None, shard_input: ShardInput) -> list[Tensor]:
    """Per kernel (dim group), ``[ids, dim]`` rows of its contiguous run of streams over the global batch."""
    if tables is None:
        return []
    if not sum(shard_input.batch_size_per_rank):
        device = shard_input.indices.device
        return [
            torch.zeros(0, b.tables[0].embedding_dim, device=device, requires_grad=True)
            for b in tables.batches
        ]
    return [
        batch(ids, offsets)
        for batch, (ids, offsets, _) in zip(tables.batches, kernel_inputs(tables, shard_input))
    ]
