"""Run the FBGEMM kernels of a rank's tables over a feature-major global batch."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.distributed.routing.input_dist import ShardInput
from rectrain.embedding.fused_tables import FusedTables


def lookup(tables: FusedTables | None, shard_input: ShardInput, device: torch.device) -> Tensor:
    """``[global batch, sum of feature dims]``: each kernel takes its contiguous run of features."""
    total = sum(shard_input.batch_size_per_rank)
    if tables is None:
        # A rank without shards still joins the output all-to-all (with zero columns).
        return torch.zeros(total, 0, device=device, requires_grad=True)
    if len(tables.batches) == 1:
        # One kernel reads every feature: no id bounds to find (reading them would wait for a GPU).
        return tables.batches[0](shard_input.indices, shard_input.offsets, shard_input.per_sample_weights)
    outputs, first = [], 0
    bounds = shard_input.offsets[::total].tolist() if total else None
    for batch in tables.batches:
        last = first + len(batch.feature_names)
        lo, hi = (bounds[first], bounds[last]) if bounds else (0, 0)
        offsets = shard_input.offsets[first * total : last * total + 1]
        weights = shard_input.per_sample_weights
        outputs.append(
            batch(
                shard_input.indices[lo:hi],
                offsets - lo if lo else offsets,
                None if weights is None else weights[lo:hi],
            )
        )
        first = last
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
