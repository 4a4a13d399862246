"""The fused optimizer of a sharded collection, keyed and typed as TorchRec's.

``state_dict()`` is ``{"state": {"embedding_bags.<table>.weight": {"<table>.<state>": value}},
"param_groups": [...]}`` under the unsharded collection's keys, whatever the sharding. A value is a
``ShardedTensor`` of views of this rank's kernel state laid out as TorchRec lays it out:

- per element (Adagrad, Adam moments ``[rows, cols]``): sharded like the table's weight;
- per row (row-wise Adagrad, ``[rows]`` per shard): row shards at their row offsets, global ``[rows]``;
  column shards each keep their own accumulator, so shard ``i`` (by column offset) sits at ``i * rows`` of a
  global ``[rows * shards]``;
- one value per shard (Adam's ``step``): shard ``i`` at offset ``i`` of a global ``[shards]``.

Data-parallel tables give plain tensors. ``load_state_dict`` copies ``ShardedTensor``s, ``DTensor``s or full
tensors into the views, so ``torch.distributed.checkpoint`` loads it in place like the model's state dict.
A rank that holds no shard of a table has an entry for it without local shards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributed._shard.sharded_tensor import ShardedTensor

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.sharded.table import ShardedTable
from rectrain.distributed.sharded.torch_state import fill, sharded_tensor
from rectrain.embedding.config import EmbOptimType, FusedOptimizerConfig
from rectrain.optim.fused import FusedEmbeddingOptimizer, FusedKernel
from rectrain.planner.types import Shard, ShardingType

ShardStates = Mapping[str, list[tuple[Shard, dict[str, Tensor]]]]
# Each fused optimizer's state per table and how it relates to a shard (FBGEMM's buffers, Adam renamed).
_STATE_KINDS = {
    EmbOptimType.SGD: {},
    EmbOptimType.ADAGRAD: {"momentum1": "per_element"},
    EmbOptimType.ROWWISE_ADAGRAD: {"momentum1": "per_row"},
    EmbOptimType.ADAM: {"exp_avg": "per_element", "exp_avg_sq": "per_element", "step": "scalar"},
}


class ShardedFusedOptimizer(FusedEmbeddingOptimizer):
    """``fused_optimizer`` of a sharded collection: one param group, one key per table (see module doc).

    Args:
        tables: ``{key: ShardedTable}`` of the collection (``sharded_state()``), read once for the geometry.
        shard_states: returns this rank's ``{key: [(shard, {state name: view})]}``
            (``sharded_optimizer_state``).
        kernels: every kernel of the collection, whose learning rate follows ``param_groups[0]["lr"]``.
        config: the hyper-parameters the kernels were built with.
        env, device: this rank and where its shards live (for the shards' placements).
    """

    def __init__(
        self,
        tables: Mapping[str, ShardedTable],
        shard_states: Callable[[], ShardStates],
        kernels: Sequence[FusedKernel],
        config: FusedOptimizerConfig,
        env: ShardingEnv,
        device: torch.device,
    ) -> None:
        self._tables = dict(tables)
        self._shard_states = shard_states
        self._kinds = _STATE_KINDS[config.optimizer]
        self._env, self._device = env, device
        # A parameter per table: this rank's first shard of it, or a placeholder where it holds none.
        params = {
            key: table.local_shards[0][1] if table.local_shards else torch.empty(0)
            for key, table in self._tables.items()
        }
        super().__init__(params, self._torch_state, kernels, config)

    def _torch_state(self) -> dict[str, dict[str, Tensor]]:
        # Every rank lists every table, also one it holds no shard of (an empty ShardedTensor then): DCP
        # takes a key missing on one rank for an old checkpoint format.
        states = self._shard_states()
        return {
            key: {
                f"{key.split('.')[-2]}.{name}": self._state_tensor(table, name, kind, states.get(key, []))
                for name, kind in self._kinds.items()
            }
            for key, table in self._tables.items()
        }

    def _state_tensor(
        self, table: ShardedTable, name: str, kind: str, pieces: list[tuple[Shard, dict[str, Tensor]]]
    ) -> Tensor:
        if table.sharding.sharding_type is ShardingType.DATA_PARALLEL:
            return pieces[0][1][name]
        shards = [s for s in table.sharding.sharding_spec or [] if s.num_rows]
        layout = _layout(kind, table, shards)
        local = [(*layout[shards.index(shard)][:2], states[name]) for shard, states in pieces]
        size = list(table.global_shape) if kind == "per_element" else [max(o[0] + n[0] for o, n, _ in layout)]
        dtype = pieces[0][1][name].dtype if pieces else torch.float32
        return sharded_tensor(local, layout, size, dtype, self._env, self._device)

    def _copy_state(self, where: str, tensor: Any, saved: Any) -> None:
        if not isinstance(tensor, ShardedTensor):
            super()._copy_state(where, tensor, saved)
            return
        targets = [
            (s.metadata.shard_offsets, s.metadata.shard_sizes, s.tensor) for s in tensor.local_shards()
        ]
        fill(where, targets, list(tensor.metadata().size), saved)


def _layout(kind: str, table: ShardedTable, shards: list[Shard]) -> list[tuple[list[int], list[int], int]]:
    """(offsets, sizes, rank) of every shard's state of ``kind``, in sharding-spec order (see module doc)."""
    if kind == "per_element":
        return [(s.shard_offsets, s.shard_sizes, s.rank) for s in shards]
    if kind == "scalar":
        return [([i], [1], s.rank) for i, s in enumerate(shards)]
    if table.sharding.sharding_type is ShardingType.COLUMN_WISE:
        by_column = sorted(range(len(shards)), key=lambda i: shards[i].col_offset)
        position = {index: p for p, index in enumerate(by_column)}
        rows = table.global_shape[0]
        return [([position[i] * rows], [rows], s.rank) for i, s in enumerate(shards)]
    return [([s.row_offset], [s.num_rows], s.rank) for s in shards]
