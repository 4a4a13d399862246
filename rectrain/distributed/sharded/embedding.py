"""``ShardedEmbeddingCollection``: an EmbeddingCollection whose tables are split across ranks by a plan.

Each rank holds its shards of the routed tables (table-, row-, column-, table-row-wise) in FBGEMM sequence
kernels (one per dim) with the fused optimizer, and a full copy of every data-parallel table. ``forward``
takes the rank's local batch and returns the same ``{key: JaggedTensor}`` the unsharded collection would:

  select features -> input all-to-all (ids to shards) -> shard lookup (one row per id)
  -> output all-to-all (rows back to the senders) -> assemble (place column shards, unbucketize row shards)
  ... plus the data-parallel lookup

Backward runs the same path in reverse through the differentiable collectives, and each shard's kernel updates
its rows as the gradient reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.routing.id_check import BoundsCheckMode
from rectrain.distributed.routing.input_dist import ShardInput, to_shard_input
from rectrain.distributed.routing.sequence_dist import (
    SequenceAssembler,
    build_sequence_routing,
    ids_per_source,
    return_rows,
    send_ids,
)
from rectrain.distributed.sharded.lookup import sequence_lookup
from rectrain.distributed.sharded.sequence_data_parallel import SequenceDataParallel
from rectrain.distributed.sharded.weights import ShardedCollection
from rectrain.embedding import EmbeddingCollection
from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.layout import get_embedding_names_by_table, group_tables
from rectrain.errors import ConfigError
from rectrain.planner.types import ParameterSharding
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor


class ShardedEmbeddingCollection(ShardedCollection):
    """The sharded form of ``ec`` on this rank: only this rank's shards are allocated.

    Args:
        ec: the unsharded collection (its tables, weights, ``need_indices`` and fused optimizer are taken);
            on the meta device, the shards get the initial values ``ec`` would have had.
        shardings: table name -> how it is sharded (every table of ``ec`` must be present).
        env: this rank's place in the process group.
        device: where this rank's shards live and run.
        fused_optimizer: the fused optimizer its kernels run; default ``ec``'s (``DistributedModelParallel``
            passes ``ec``'s with ``cpu_backward="auto"`` replaced by the kernel all ranks agreed on).
        bounds_check_mode: what an id outside its table does (``routing.id_check``; the sharder's
            ``fused_params["bounds_check_mode"]`` under DMP).
    """

    prefix = "embeddings"

    def __init__(
        self,
        ec: EmbeddingCollection,
        shardings: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device,
        *,
        fused_optimizer: FusedOptimizerConfig | None = None,
        bounds_check_mode: BoundsCheckMode = BoundsCheckMode.FATAL,
    ) -> None:
        super().__init__()
        self._need_indices = ec.need_indices()
        tables, routed = self._plan(ec.embedding_configs(), shardings, env, device)
        optimizer = fused_optimizer or ec.fused_optimizer_config
        if ec.fused_optimizer_config is None and len(routed) < len(tables):
            raise ConfigError(
                "data_parallel tables of an EmbeddingCollection built without fused_optimizer= are not "
                "supported (TorchRec cannot run them on CPU either); plan another sharding type or give the "
                "collection fused_optimizer="
            )
        self.routing = build_sequence_routing(tables, routed, env.world_size)
        local_tables = list(self.routing.shard_tables[env.rank])
        groups = group_tables(local_tables, key=lambda t: (t.embedding_dim, t.data_type, t.storage))
        self.embeddings = (
            FusedTables(
                local_tables, groups, [PoolingMode.NONE] * len(groups), optimizer, device, prefix="embeddings"
            )
            if local_tables
            else None
        )
        names_by_table = dict(zip((t.name for t in tables), get_embedding_names_by_table(tables)))
        dp_tables = [t for t in tables if t.name not in routed]
        self.data_parallel = (
            SequenceDataParallel(dp_tables, names_by_table, optimizer, env, device) if dp_tables else None
        )
        self._build(tables, ec, optimizer, bounds_check_mode)
        self._assembler = SequenceAssembler(self.routing)
        feature_of = {n: f for t in tables for f, n in zip(t.feature_names, names_by_table[t.name])}
        self._key_features = [
            self.routing.features.index(feature_of[n]) for n in self.routing.embedding_names
        ]
        self._stream_dims = [s.num_cols for s in self.routing.streams[env.rank]]
        self._embedding_names = [n for t in tables for n in names_by_table[t.name]]

    def embedding_configs(self) -> list:
        return self._tables

    def need_indices(self) -> bool:
        return self._need_indices

    def _routed_forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """Input all-to-all, shard lookup, output all-to-all, assembly: the routed tables' outputs."""
        local = self._selector(features, False)
        local.values = self._id_check(local.lengths, local.values)
        sent, pending = send_ids(self.routing, local, self.env.pg)
        lengths, values, batches = pending.wait()
        num_streams = len(self._stream_dims)
        # Feed the kernel positions first: its ids are then ``values[positions]``.
        positions = torch.arange(values.numel(), device=values.device)
        order = to_shard_input(num_streams, lengths, positions, None, batches)
        shard_input = ShardInput(values[order.indices], order.offsets, None, batches)
        rows = sequence_lookup(self.embeddings, shard_input)
        counts = ids_per_source(lengths, num_streams, batches)
        dims_back = self._assembler.dims_from(sent.ids_per_stream)
        flat = return_rows(rows, self._stream_dims, counts, dims_back, self.env.pg, self._device)
        ids_per_feature = local.lengths.sum(dim=1).tolist()
        outputs = self._assembler.assemble(flat, sent, ids_per_feature)
        ids = local.values.split(ids_per_feature)
        return {
            name: JaggedTensor(
                values=out,
                weights=ids[f] if self._need_indices else None,
                lengths=local.lengths[f],
            )
            for name, out, f in zip(self.routing.embedding_names, outputs, self._key_features)
        }

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """``{key: JaggedTensor}`` of this rank's batch (values ``[ids, dim]``), as unsharded ``ec`` gives."""
        out: dict[str, JaggedTensor] = {}
        if self.routing.features:
            out.update(self._routed_forward(features))
        if self.data_parallel is not None:
            out.update(self.data_parallel(features, self._need_indices))
        return {name: out[name] for name in self._embedding_names}
