"""``ShardedEmbeddingBagCollection``: an EmbeddingBagCollection whose tables are split across ranks by a plan.

Each rank holds its shards of the routed tables (table-, row-, column-, table-row-wise) in one FBGEMM kernel
with the fused optimizer, and a full copy of every data-parallel table. ``forward`` takes the rank's local
batch and returns the same ``KeyedTensor`` the unsharded collection would return for it:

  select features -> input all-to-all (ids to shards) -> shard lookup -> output all-to-all (pools back)
  -> assemble (place column shards, add row shards, divide MEAN)   ... plus the data-parallel lookup

Backward runs the same path in reverse through the differentiable collectives, and each shard's kernel updates
its rows as the gradient reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby

import torch
from torch import Tensor

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.comm.pending import Pending
from rectrain.distributed.routing.id_check import BoundsCheckMode
from rectrain.distributed.routing.input_dist import (
    LocalFeatures,
    send_features,
    to_shard_input,
)
from rectrain.distributed.routing.output_dist import PooledAssembler
from rectrain.distributed.routing.routes import build_routing
from rectrain.distributed.sharded.data_parallel import DataParallelTables
from rectrain.distributed.sharded.dense_data_parallel import DenseDataParallelTables
from rectrain.distributed.sharded.lookup import lookup
from rectrain.distributed.sharded.row_counts import RowCounts
from rectrain.distributed.sharded.table import shard_tables_of
from rectrain.distributed.sharded.weights import ShardedCollection
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import FusedOptimizerConfig, PoolingType
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.layout import get_embedding_names_by_table
from rectrain.embedding.table_batch import pooling_mode
from rectrain.errors import ConfigError
from rectrain.planner.types import ParameterSharding, Shard, ShardingType
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor


class ShardedEmbeddingBagCollection(ShardedCollection):
    """The sharded form of ``ebc`` on this rank: only this rank's shards are allocated.

    Args:
        ebc: the unsharded collection (its tables, weights and fused optimizer settings are taken over); on
            the meta device, the shards get the initial values ``ebc`` would have had.
        shardings: table name -> how it is sharded (every table of ``ebc`` must be present).
        env: this rank's place in the process group.
        device: where this rank's shards live and run.
        fused_optimizer: the fused optimizer its kernels run; default ``ebc``'s (``DistributedModelParallel``
            passes the one taken TorchRec's way, with ``cpu_backward="auto"`` replaced by the kernel all
            ranks agreed on). When ``ebc`` was built without one (TorchRec's way), its data-parallel tables
            stay trainable parameters (``dense_data_parallel``).
        bounds_check_mode: what an id outside its table does (``routing.id_check``; the sharder's
            ``fused_params["bounds_check_mode"]`` under DMP).
    """

    prefix = "embedding_bags"

    def __init__(
        self,
        ebc: EmbeddingBagCollection,
        shardings: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device,
        *,
        fused_optimizer: FusedOptimizerConfig | None = None,
        bounds_check_mode: BoundsCheckMode = BoundsCheckMode.FATAL,
    ) -> None:
        super().__init__()
        self._is_weighted = ebc.is_weighted()
        tables, routed = self._plan(ebc.embedding_bag_configs(), shardings, env, device)
        optimizer = fused_optimizer or ebc.fused_optimizer_config
        self.routing = build_routing(tables, routed, env.world_size)
        local_tables = list(self.routing.shard_tables[env.rank])
        if len({t.data_type for t in tables}) > 1:
            raise ConfigError("a sharded EmbeddingBagCollection needs one data_type for all its tables")
        # All shards pool SUM (see routing), so one kernel holds every shard of this rank; a change of storage
        # (RAM / disk) starts another, over the next contiguous run of shards (``lookup`` reads runs).
        runs = [
            list(group)
            for _, group in groupby(range(len(local_tables)), key=lambda i: local_tables[i].storage)
        ]
        self.embedding_bags = (
            FusedTables(
                local_tables,
                runs,
                [pooling_mode(PoolingType.SUM)] * len(runs),
                optimizer,
                device,
                prefix="embedding_bags",
            )
            if local_tables
            else None
        )
        dp_tables = [t for t in tables if t.name not in routed]
        names_by_table = get_embedding_names_by_table(tables)
        names = dict(zip((t.name for t in tables), names_by_table))
        self.data_parallel = (
            (
                DenseDataParallelTables(dp_tables, names, self._is_weighted, device)
                if ebc.fused_optimizer_config is None
                else DataParallelTables(dp_tables, names, optimizer, env, device)
            )
            if dp_tables
            else None
        )
        self._build(tables, ebc, optimizer, bounds_check_mode)
        self._assembler = PooledAssembler(self.routing, device)
        self._embedding_names = [n for names in names_by_table for n in names]
        self._dims = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._columns = self._output_columns(dp_tables)
        self._prefetched: tuple[KeyedJaggedTensor, LocalFeatures, Pending] | None = None
        self.row_counts: RowCounts | None = None  # off until ``track_row_counts``

    def _output_columns(self, dp_tables: list) -> Tensor | None:
        """Column order taking [routed outputs | data-parallel outputs] to the collection's table order."""
        parts = list(self.routing.embedding_names) + (self.data_parallel.embedding_names if dp_tables else [])
        widths = dict(zip(self._embedding_names, self._dims))
        start, position = {}, 0
        for name in parts:
            start[name] = position
            position += widths[name]
        order = [start[name] + c for name in self._embedding_names for c in range(widths[name])]
        return None if order == list(range(position)) else torch.tensor(order, device=self._device)

    def embedding_bag_configs(self) -> list:
        return self._tables

    def is_weighted(self) -> bool:
        return self._is_weighted

    def _start_input_dist(self, features: KeyedJaggedTensor) -> tuple[LocalFeatures, Pending]:
        local = self._selector(features, self._is_weighted)
        local.values = self._id_check(local.lengths, local.values)
        return local, send_features(self.routing, local, self.env.pg)

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Start sending ``features``' ids to the shards now; the ``forward`` given the same KJT uses them.

        Called by ``TrainPipelineSparseDist`` one batch ahead, so the input all-to-all overlaps the current
        batch's compute. Every rank must prefetch the same batches in the same order (as a pipeline does).
        """
        if self.routing.features:
            self._prefetched = (features, *self._start_input_dist(features))

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pooled embeddings of this rank's batch, as the unsharded collection returns them."""
        outputs = []
        if self.routing.features:
            if self._prefetched is not None and self._prefetched[0] is features:
                _, local, pending = self._prefetched
                self._prefetched = None
            else:
                local, pending = self._start_input_dist(features)
            lengths, values, weights, batches = pending.wait()
            shard_input = to_shard_input(
                len(self.routing.streams[self.env.rank]), lengths, values, weights, batches
            )
            if self.row_counts is not None and self.training:
                self.row_counts.observe(shard_input)
            pooled = lookup(self.embedding_bags, shard_input, self._device)
            received = self._assembler.send(pooled, batches, self.env.pg).wait()
            outputs.append(self._assembler.assemble(received, local.lengths))
        if self.data_parallel is not None:
            outputs.append(self.data_parallel(features, self._is_weighted))
        values = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        if self._columns is not None:
            values = values.index_select(1, self._columns)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._dims, values=values, key_dim=1)

    def track_row_counts(self) -> None:
        """Count, from now on, the lookups of every row of this rank's shards while training (see
        ``row_counts``); a no-op when already counting or when the rank holds no shard."""
        if self.row_counts is None and self.embedding_bags is not None:
            self.row_counts = RowCounts(self.embedding_bags)

    def sharded_row_counts(self) -> dict[str, list[tuple[Shard, Tensor]]]:
        """``embedding_bags.<table>.weight`` -> this rank's ``(shard, int32 counts [num_rows])`` of every
        counted (routed) table; empty when not counting."""
        if self.row_counts is None:
            return {}
        counts = self.row_counts
        return {
            f"embedding_bags.{table.name}.weight": [
                (shard, counts.of(name))
                for name, shard in shard_tables_of(table, self._shardings[table.name], self.env.rank)
            ]
            for table in self._tables
            if self._shardings[table.name].sharding_type is not ShardingType.DATA_PARALLEL
        }
