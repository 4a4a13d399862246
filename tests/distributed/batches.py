"""Batches and checks shared by the sharded-collection tests: one global batch, each rank's slice of it.

Every rank draws the same global batch from the step's seed; the reference collection reads all of it and a
sharded rank reads its own contiguous run of examples, so the two can be compared row by row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rectrain.distributed.sharded.table import ShardedTable
from rectrain.sparse import KeyedJaggedTensor

TOL = {"atol": 1e-5, "rtol": 1e-4}


def global_batch(
    step: int, rows: Mapping[str, int], total: int, weighted: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Lengths ``[features, total]`` (features in ``rows`` order), ids below ``rows[f]``, optional weights."""
    gen = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(0, 4, (len(rows), total), generator=gen)
    ids = [torch.randint(0, n, (int(lengths[i].sum()),), generator=gen) for i, n in enumerate(rows.values())]
    weights = torch.rand(int(lengths.sum()), generator=gen) if weighted else None
    return lengths, torch.cat(ids), weights


def local_kjt(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    features: Sequence[str],
    start: int,
    size: int,
    key_order: Sequence[str] | None = None,
) -> KeyedJaggedTensor:
    """Examples ``[start, start + size)`` of the global batch (rows of ``lengths`` are ``features``).

    Keys are an unread key ``unused`` first (a collection must select its own features), then ``key_order``
    (default: ``features``), so a test can also feed keys in another order than the tables name them.
    """
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.reshape(-1).cumsum(0)])
    total = lengths.shape[1]
    keep = {}
    for f, name in enumerate(features):
        lo, hi = int(offsets[f * total + start]), int(offsets[f * total + start + size])
        keep[name] = (
            lengths[f, start : start + size],
            values[lo:hi],
            None if weights is None else weights[lo:hi],
        )
    keep["unused"] = (
        torch.ones(size, dtype=torch.int64),
        torch.zeros(size, dtype=torch.int64),
        torch.ones(size),
    )
    keys = ["unused", *(features if key_order is None else key_order)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.cat([keep[k][1] for k in keys]),
        lengths=torch.cat([keep[k][0] for k in keys]),
        weights=None if weights is None else torch.cat([keep[k][2] for k in keys]),
    )


def assert_shards_match(state: Mapping[str, ShardedTable], reference: Mapping[str, torch.Tensor]) -> None:
    """Every local shard equals its rectangle of the reference table of the same state-dict key."""
    for key, table in state.items():
        for shard, tensor in table.local_shards:
            rows = slice(shard.row_offset, shard.row_offset + shard.num_rows)
            cols = slice(shard.col_offset, shard.col_offset + shard.num_cols)
            torch.testing.assert_close(
                tensor, reference[key][rows, cols], **TOL, msg=lambda m, k=key: f"{k}: {m}"
            )
