"""What the pooled and the sequence sharded collections share: the plan check, weights and state of shards.

Both hold a rank's routed shards in one ``FusedTables`` (named ``<table>#<i>``) and its data-parallel tables
in a replicated module with a ``weight(table)`` method; :class:`ShardedCollection` builds and reads that pair
(plan, id check, weights, ``state_dict``, fused optimizer), so the two collections differ only in their
kernels and their forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.routing.id_check import BoundsCheckMode, IdCheck
from rectrain.distributed.routing.input_dist import FeatureSelector
from rectrain.distributed.sharded.optimizer import ShardedFusedOptimizer
from rectrain.distributed.sharded.table import ShardedTable, shard_tables_of
from rectrain.distributed.sharded.torch_state import install_state_dict_hooks, table_dtype
from rectrain.embedding import init
from rectrain.embedding.config import BaseEmbeddingConfig, FusedOptimizerConfig
from rectrain.embedding.fused_tables import FusedTables
from rectrain.errors import ConfigError
from rectrain.planner.types import EmbeddingComputeKernel, ParameterSharding, Shard, ShardingType


class Replicated(Protocol):
    """The data-parallel side of a sharded collection: fused (``DataParallelTables``,
    ``SequenceDataParallel``: ``tables`` is a ``FusedTables``) or trainable parameters
    (``DenseDataParallelTables``: the user's optimizer steps them, the fused optimizer leaves them out)."""

    tables: FusedTables | nn.ModuleDict

    def weight(self, table: str) -> Tensor: ...


def _fused_replicas(data_parallel: Replicated | None) -> FusedTables | None:
    tables = None if data_parallel is None else data_parallel.tables
    return tables if isinstance(tables, FusedTables) else None


def plan_of(
    tables: Sequence[BaseEmbeddingConfig], shardings: Mapping[str, ParameterSharding]
) -> dict[str, ParameterSharding]:
    """Each table's sharding in table order; ConfigError naming the tables the plan has no entry for."""
    missing = [t.name for t in tables if t.name not in shardings]
    if missing:
        raise ConfigError(f"the sharding plan has no entry for tables {missing}")
    return {t.name: shardings[t.name] for t in tables}


def key_value_on_disk(
    tables: Sequence[BaseEmbeddingConfig], shardings: Mapping[str, ParameterSharding], device: torch.device
) -> list[BaseEmbeddingConfig]:
    """``tables`` with ``storage = "disk"`` where the plan's compute kernel is TorchRec's ``key_value`` (the
    fused kernel over a disk table); refused by name where that cannot run (data-parallel, not on CPU)."""
    out = []
    for table in tables:
        sharding = shardings[table.name]
        if sharding.compute_kernel is not EmbeddingComputeKernel.KEY_VALUE:
            out.append(table)
            continue
        if sharding.sharding_type is ShardingType.DATA_PARALLEL or device.type != "cpu":
            raise ConfigError(
                f"table {table.name!r}: compute kernel 'key_value' (a disk table) runs only on CPU and not "
                f"data-parallel; the plan has {sharding.sharding_type.value} on {device.type}"
            )
        out.append(dataclasses.replace(table, storage="disk"))
    return out


def routed_shardings(shardings: Mapping[str, ParameterSharding]) -> dict[str, ParameterSharding]:
    """The tables that go through the all-to-alls (every sharding type but data-parallel)."""
    return {n: s for n, s in shardings.items() if s.sharding_type is not ShardingType.DATA_PARALLEL}


@torch.no_grad()
def materialise(
    tables: Sequence[BaseEmbeddingConfig],
    shardings: Mapping[str, ParameterSharding],
    rank: int,
    source: nn.ModuleDict,
    seed: int,
    local: Callable[[str, str | None], Tensor],
) -> None:
    """Give each of this rank's shards and data-parallel tables (``local(table, shard_name)``) its values.

    From the unsharded collection's tables (``source``: its ``FusedTables``, or its ``nn.EmbeddingBag`` /
    ``nn.Embedding`` modules when it was built without ``fused_optimizer=``) when they exist; when the
    collection was built on the meta device, drawn from its ``seed`` (``rectrain.embedding.init``): the values
    the unsharded collection would hold, fused or not, computed for this rank's rows and columns only.
    """
    for table in tables:
        full = source[table.name].weight
        for shard_name, shard in shard_tables_of(table, shardings[table.name], rank):
            target = local(table.name, shard_name)
            if full.is_meta:
                init.fill_rows(target, table, seed, shard.row_offset, shard.col_offset)
                continue
            rows = slice(shard.row_offset, shard.row_offset + shard.num_rows)
            cols = slice(shard.col_offset, shard.col_offset + shard.num_cols)
            target.copy_(full[rows, cols])


class ShardedCollection(nn.Module):
    """A sharded collection on this rank: its routed shards in one ``FusedTables`` (the attribute named
    ``prefix``, as the unsharded collection names its tables; None when the rank holds no shard), its
    data-parallel tables in ``data_parallel`` and its ``routing``. A subclass calls :meth:`_plan`, builds
    those three, then :meth:`_build`; it adds its kernels' layout and ``forward``."""

    prefix: str  # "embeddings" (EmbeddingCollection) or "embedding_bags" (EmbeddingBagCollection)
    routing: Any
    data_parallel: Replicated | None

    def _plan(
        self,
        tables: Sequence[BaseEmbeddingConfig],
        shardings: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device,
    ) -> tuple[list[BaseEmbeddingConfig], dict[str, ParameterSharding]]:
        """Take the plan of ``tables``; returns the tables as the kernels hold them (``key_value_on_disk``)
        and the routed tables' shardings."""
        self.env, self._device = env, device
        self._tables = list(tables)
        self._shardings = plan_of(tables, shardings)
        tables = key_value_on_disk(tables, self._shardings, torch.device(device))
        return tables, routed_shardings(self._shardings)

    def _build(
        self,
        tables: Sequence[BaseEmbeddingConfig],
        source: nn.Module,
        optimizer: FusedOptimizerConfig,
        bounds_check_mode: BoundsCheckMode,
    ) -> None:
        """Fill the shards from the unsharded collection ``source``; the routed features' selector and id
        check, ``state_dict``'s hooks and the fused optimizer."""
        materialise(
            tables,
            self._shardings,
            self.env.rank,
            getattr(source, self.prefix),
            source.init_seed,
            self._local_weight,
        )
        self._selector = FeatureSelector(self.routing.features)
        routed = routed_shardings(self._shardings)
        rows = {f: t.num_embeddings for t in tables if t.name in routed for f in t.feature_names}
        self._id_check = IdCheck(
            self.routing.features, [rows[f] for f in self.routing.features], mode=bounds_check_mode
        )
        # state_dict(): each table once, as TorchRec's ShardedTensor (plain tensor if data-parallel).
        install_state_dict_hooks(self)
        self._fused_optimizer = self._new_fused_optimizer(optimizer)

    @property
    def _kernels(self) -> FusedTables | None:
        return getattr(self, self.prefix)

    @property
    def device(self) -> torch.device:
        """Where this rank's shards live."""
        return self._device

    @property
    def fused_optimizer(self) -> torch.optim.Optimizer:
        return self._fused_optimizer

    def _local_weight(self, table: str, shard_name: str | None) -> Tensor:
        """This rank's weight of one shard (``shard_name``) or of a data-parallel table (None)."""
        if shard_name is None:
            return self.data_parallel.weight(table)
        return self._kernels[shard_name].weight

    def sharded_state(self) -> dict[str, ShardedTable]:
        """``<prefix>.<table>.weight`` -> this rank's shards of it with global shape and offsets."""
        return {
            f"{self.prefix}.{table.name}.weight": ShardedTable(
                global_shape=(table.num_embeddings, table.embedding_dim),
                sharding=self._shardings[table.name],
                dtype=table_dtype(table.data_type),
                local_shards=[
                    (shard, self._local_weight(table.name, shard_name))
                    for shard_name, shard in shard_tables_of(
                        table, self._shardings[table.name], self.env.rank
                    )
                ],
            )
            for table in self._tables
        }

    def sharded_optimizer_state(self) -> dict[str, list[tuple[Shard, dict[str, Tensor]]]]:
        """``<prefix>.<table>.weight`` -> this rank's ``(shard, {state name: view})`` of the fused optimizer.

        The keys and shards are those of :meth:`sharded_state`. A state is shaped like its shard
        (``[num_rows, num_cols]``: Adagrad, Adam moments), per row (``[num_rows]``: row-wise Adagrad, one
        accumulator per shard row, so a column shard has its own) or ``[1]`` (Adam's step). Views of the
        kernels' storage: copying into them restores the state.
        """
        shard_states = self._kernels.table_optimizer_states() if self._kernels is not None else {}
        replicas = _fused_replicas(self.data_parallel)
        replica_states = replicas.table_optimizer_states() if replicas is not None else {}
        return {
            f"{self.prefix}.{table.name}.weight": [
                (shard, shard_states[shard_name] if shard_name is not None else replica_states[table.name])
                for shard_name, shard in shard_tables_of(table, self._shardings[table.name], self.env.rank)
            ]
            for table in self._tables
            if replicas is not None
            or self._shardings[table.name].sharding_type is not ShardingType.DATA_PARALLEL
        }

    def _new_fused_optimizer(self, config: FusedOptimizerConfig) -> ShardedFusedOptimizer:
        """The fused optimizer over the shards and replicas, keyed per table as TorchRec keys it."""
        kernels = [*(self._kernels.batches if self._kernels is not None else [])]
        replicas = _fused_replicas(self.data_parallel)
        kernels += replicas.batches if replicas is not None else []
        tables = {
            key: table
            for key, table in self.sharded_state().items()
            if replicas is not None or table.sharding.sharding_type is not ShardingType.DATA_PARALLEL
        }
        return ShardedFusedOptimizer(
            tables, self.sharded_optimizer_state, kernels, config, self.env, self.device
        )

    def extra_repr(self) -> str:
        kinds: dict[str, list[str]] = {}
        for name, sharding in self._shardings.items():
            kinds.setdefault(sharding.sharding_type.value, []).append(name)
        return f"rank={self.env.rank}/{self.env.world_size}, " + ", ".join(
            f"{k}: {v}" for k, v in kinds.items()
        )
