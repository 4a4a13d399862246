"""Data-parallel sequence tables: a full copy on every rank, kept identical by giving each the same update.

The same global-batch trick as ``data_parallel.py``: every rank looks up the all-gathered global batch and, in
backward, receives every rank's row gradients (all-gathered), so every replica's fused kernel applies the same
sparse update. The kernel's rows are feature-major (feature, source rank, example); a rank's own rows are one
block per feature, so the rows travel flattened and blocks are transposed between the two orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import Tensor
from torch.autograd import Function

from rectrain.distributed.comm import ops as comm
from rectrain.distributed.comm.autograd import divided_gradient
from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.routing.input_dist import to_shard_input
from rectrain.distributed.routing.sequence_dist import ids_per_source, transpose_blocks
from rectrain.distributed.sharded.data_parallel import ReplicatedTables, gather_global_batch
from rectrain.distributed.sharded.lookup import sequence_lookup
from rectrain.embedding.config import EmbeddingConfig, FusedOptimizerConfig
from rectrain.embedding.feature_routing import KJTLike
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.layout import group_tables
from rectrain.sparse import JaggedTensor


class _OwnBlocksWithGlobalGrad(Function):
    """Forward: this rank's blocks of the flat global rows. Backward: every rank's gradients, all-gathered.

    ``sizes[k][q]``: elements of feature k from rank q, in the flat (feature, rank) order.
    """

    @staticmethod
    def forward(ctx: Any, flat: Tensor, sizes: list[list[int]], group: dist.ProcessGroup | None) -> Tensor:
        ctx.sizes, ctx.group = sizes, group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        per_rank = [sum(row[q] for row in sizes) for q in range(world)]
        start = sum(per_rank[:rank])
        return transpose_blocks(flat, sizes).narrow(0, start, per_rank[rank]).clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        world = dist.get_world_size(ctx.group)
        per_rank = [sum(row[q] for row in ctx.sizes) for q in range(world)]
        gathered = divided_gradient(comm.all_gather_v(grad.contiguous(), per_rank, ctx.group), ctx.group)
        by_rank = [[row[q] for row in ctx.sizes] for q in range(world)]
        return transpose_blocks(gathered, by_rank), None, None


class SequenceDataParallel(ReplicatedTables):
    """The data-parallel tables of a sharded EmbeddingCollection (per-id rows)."""

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        embedding_names: Mapping[str, list[str]],
        optimizer: FusedOptimizerConfig,
        env: ShardingEnv,
        device: torch.device,
    ) -> None:
        groups = group_tables(list(tables), key=lambda t: (t.embedding_dim, t.data_type, t.storage))
        none = [PoolingMode.NONE] * len(groups)
        super().__init__(
            FusedTables(list(tables), groups, none, optimizer, device, prefix="embeddings"),
            embedding_names,
            env,
        )

    def _global_rows(self, lengths: Tensor, values: Tensor, batches: list[int]) -> Tensor:
        """Flat rows of the global batch, feature-major then source rank (all kernels' features in order)."""
        global_input = to_shard_input(len(self._dims), lengths, values, None, batches)
        flats = [rows.reshape(-1) for rows in sequence_lookup(self.tables, global_input) if rows.numel()]
        if not flats:
            return torch.zeros(0, device=values.device, requires_grad=True)
        return torch.cat(flats)

    def forward(self, features: KJTLike, need_indices: bool) -> dict[str, JaggedTensor]:
        """This rank's ``{key: JaggedTensor}`` for the data-parallel tables (keys in kernel order)."""
        local = self._selector(features, False)
        world, num = self.env.world_size, len(self._dims)
        lengths, values, _, batches = gather_global_batch(local, num, self.env)
        ids = ids_per_source(lengths, num, batches)
        sizes = [[ids[q][k] * d for q in range(world)] for k, d in enumerate(self._dims)]
        own = _OwnBlocksWithGlobalGrad.apply(self._global_rows(lengths, values, batches), sizes, self.env.pg)
        mine = ids[self.env.rank]
        pieces = own.split([n * d for n, d in zip(mine, self._dims)])
        local_ids = local.values.split(mine)
        return {
            name: JaggedTensor(
                values=piece.view(n, d),
                weights=local_ids[k] if need_indices else None,
                lengths=local.lengths[k],
            )
            for k, (name, piece, n, d) in enumerate(zip(self.embedding_names, pieces, mine, self._dims))
        }
