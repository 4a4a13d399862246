"""Data-parallel tables: a full copy on every rank, kept identical by giving every copy the same update.

A fused optimizer updates rows inside backward, so there is no weight gradient to all-reduce. Instead
every rank looks up the *global* batch (ids are all-gathered, which is cheap next to a table) and, in
backward, receives the *global* output gradient (all-gathered), so every replica's kernel applies exactly the
same sparse update. The cost is the data-parallel lookups done on every rank, so this suits small tables; the
gain is exact fused-optimizer semantics (Adam and row-wise Adagrad touch only the rows a batch read) and
bitwise-identical replicas without ever moving a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.autograd import Function

from rectrain.distributed.comm import ops as comm
from rectrain.distributed.comm.autograd import divided_gradient
from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.routing.input_dist import FeatureSelector, LocalFeatures, to_shard_input
from rectrain.distributed.sharded.lookup import lookup
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.embedding.feature_routing import KJTLike
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.layout import group_tables
from rectrain.embedding.table_batch import pooling_mode


class _LocalRowsWithGlobalGrad(Function):
    """Forward: this rank's rows of the global output. Backward: every rank's row gradients, gathered."""

    @staticmethod
    def forward(
        ctx: Any, full: Tensor, start: int, sizes: list[int], group: dist.ProcessGroup | None
    ) -> Tensor:
        ctx.sizes, ctx.group = sizes, group
        rank = dist.get_rank(group)
        return full.narrow(0, start, sizes[rank]).clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        full = comm.all_gather_v(grad.contiguous(), ctx.sizes, ctx.group)
        return divided_gradient(full, ctx.group), None, None, None


def gather_global_batch(
    local: LocalFeatures, num_features: int, env: ShardingEnv
) -> tuple[Tensor, Tensor, Tensor | None, list[int]]:
    """Every rank's ``local`` batch, all-gathered: lengths, ids, weights (None if unweighted), batch per rank.

    Lengths and ids come rank after rank (each rank's block feature-major), as ``to_shard_input`` takes them.
    """
    group, world = env.pg, env.world_size
    counts = torch.tensor([local.batch_size, local.values.numel()], device=local.values.device)
    batches, totals = comm.all_gather_v(counts, [2] * world, group).view(world, 2).t().tolist()
    lengths = comm.all_gather_v(local.lengths.reshape(-1), [b * num_features for b in batches], group)
    values = comm.all_gather_v(local.values, totals, group)
    weights = None if local.weights is None else comm.all_gather_v(local.weights, totals, group)
    return lengths, values, weights, batches


class ReplicatedTables(nn.Module):
    """Data-parallel tables whole on every rank in one ``FusedTables`` (fused optimizer), looked up over the
    all-gathered global batch. ``embedding_names`` maps each table to its output keys as the whole
    collection names them; ``self.embedding_names`` lists them in kernel order."""

    def __init__(
        self, tables: FusedTables, embedding_names: Mapping[str, list[str]], env: ShardingEnv
    ) -> None:
        super().__init__()
        self.env, self.tables = env, tables
        ordered = [t for batch in tables.batches for t in batch.tables]
        self.embedding_names = [n for t in ordered for n in embedding_names[t.name]]
        self._dims = [t.embedding_dim for t in ordered for _ in t.feature_names]
        self._selector = FeatureSelector(tuple(f for batch in tables.batches for f in batch.feature_names))

    @property
    def fused_optimizer(self) -> torch.optim.Optimizer:
        return self.tables.fused_optimizer

    def weight(self, table: str) -> Tensor:
        return self.tables[table].weight


class DataParallelTables(ReplicatedTables):
    """The data-parallel tables of a sharded EmbeddingBagCollection (pooled)."""

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        embedding_names: Mapping[str, list[str]],
        optimizer: FusedOptimizerConfig,
        env: ShardingEnv,
        device: torch.device,
    ) -> None:
        groups = group_tables(list(tables), key=lambda t: (t.pooling, t.storage))
        pooling = [pooling_mode(tables[g[0]].pooling) for g in groups]
        fused = FusedTables(list(tables), groups, pooling, optimizer, device, prefix="embedding_bags")
        super().__init__(fused, embedding_names, env)
        self._device = device

    def forward(self, features: KJTLike, weighted: bool) -> Tensor:
        """This rank's ``[batch, dims]`` pooled output, columns in kernel order (see ``embedding_names``)."""
        local = self._selector(features, weighted)
        num = len(self._selector.features)
        lengths, values, weights, batches = gather_global_batch(local, num, self.env)
        full = lookup(self.tables, to_shard_input(num, lengths, values, weights, batches), self._device)
        start = sum(batches[: self.env.rank])
        return _LocalRowsWithGlobalGrad.apply(full, start, batches, self.env.pg)
