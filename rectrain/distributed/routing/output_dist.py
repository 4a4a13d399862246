"""Output distribution: pooled shard outputs travel back to the ranks that own the examples and are assembled.

Every rank's kernel output is ``[global batch, its stream columns]``; one all-to-all
(``comm.alltoall_pooled``) returns to each rank ``[its batch, all ranks' stream columns]``. One ``index_add``
then both places column shards side by side and sums row shards' partial pools (a row-wise reduce-scatter
expressed as all-to-all plus add, which keeps the result bitwise identical on every backend), and MEAN
tables are divided by the bag lengths last, because a row shard only sees part of each bag.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.distributed.comm import ops as comm
from rectrain.distributed.comm.pending import Pending
from rectrain.distributed.routing.routes import Routing
from rectrain.embedding.pooling import divide_by_bag_lengths


class PooledAssembler:
    """Turns the received pooled pieces into the collection's ``[batch, output dim]`` values."""

    def __init__(self, routing: Routing, device: torch.device) -> None:
        self.routing = routing
        columns = [
            stream.out_col + c
            for streams in routing.streams
            for stream in streams
            for c in range(stream.num_cols)
        ]
        self.columns = torch.tensor(columns, dtype=torch.int64, device=device)
        self.dims_per_rank = routing.dims_per_rank()
        # Without row shards every output column comes from exactly one place: a gather (or nothing) suffices.
        self._gather: Tensor | None = None
        self._adds = len(set(columns)) != len(columns) or len(columns) != routing.output_dim
        if not self._adds and columns != list(range(len(columns))):
            self._gather = torch.argsort(self.columns)

    def send(
        self, pooled: Tensor, batch_size_per_rank: list[int], group: dist.ProcessGroup | None
    ) -> Pending[Tensor]:
        """Start returning this rank's pooled output to the example owners."""
        if self.routing.world_size == 1:
            return Pending.ready(pooled)
        return comm.alltoall_pooled(pooled, batch_size_per_rank, self.dims_per_rank, group, async_op=True)

    def assemble(self, received: Tensor, lengths: Tensor) -> Tensor:
        """``received`` is ``[batch, sum of dims_per_rank]``; ``lengths`` the local ``[features, batch]``."""
        if self._adds:
            out = received.new_zeros(received.shape[0], self.routing.output_dim)
            out = out.index_add(1, self.columns, received)
        else:
            out = received if self._gather is None else received.index_select(1, self._gather)
        return divide_by_bag_lengths(out, lengths, self.routing.mean_features)
