"""Sharded tables in torch's own state-dict type: ``ShardedTensor``, as TorchRec's sharded modules give them.

A sharded collection keeps its shards in FBGEMM kernels under internal names (``<table>#<i>``). Its
``state_dict()`` instead shows each table once, under the unsharded collection's key
(``embedding_bags.<table>.weight``), as a ``ShardedTensor`` whose local shards are views of this rank's kernel
storage and whose global metadata lists every rank's shard (``ShardMetadata`` offsets, sizes and placement
``rank:R/<device>``). Data-parallel tables are plain tensors, as in TorchRec. So
``torch.distributed.checkpoint`` saves and re-shards them (it writes into the views in place), and TorchRec
code reading ``local_shards()`` / ``shard.metadata.shard_offsets`` / ``shard.tensor`` works unchanged.

``load_state_dict`` takes a ``ShardedTensor`` (rectangles are cut out of the local shards that cover this
rank's shards), a ``DTensor`` (gathered) or a full tensor (re-sharded locally).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard as TorchShard
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.distributed.tensor import DTensor

from rectrain.distributed.env import ShardingEnv
from rectrain.distributed.sharded_table import ShardedTable
from rectrain.errors import ConfigError
from rectrain.planner.types import Shard, ShardingType


def _placement(rank: int, env: ShardingEnv, device: torch.device) -> str:
    if device.type == "cuda":
        # Other ranks' devices are not known here; torchrun gives rank r the device of its local rank.
        index = device.index if rank == env.rank else rank % env.local_world_size
        return f"rank:{rank}/cuda:{index}"
    return f"rank:{rank}/{device.type}"


def _metadata(shard: Shard, rank: int, env: ShardingEnv, device: torch.device) -> ShardMetadata:
    return ShardMetadata(shard.shard_offsets, shard.shard_sizes, _placement(rank, env, device))


def to_torch(table: ShardedTable, env: ShardingEnv, device: torch.device) -> Tensor:
    """``table`` as TorchRec shows it: a ``ShardedTensor`` of views, or a plain tensor if data-parallel."""
    if table.sharding.sharding_type is ShardingType.DATA_PARALLEL:
        (_, tensor), *_ = table.local_shards
        return tensor.detach()
    spec = [s for s in table.sharding.sharding_spec or [] if s.num_rows]  # as shard_tables_of: no empty ones
    local = [
        TorchShard(tensor.detach(), _metadata(shard, env.rank, env, device))
        for shard, tensor in table.local_shards
    ]
    dtype = local[0].tensor.dtype if local else _dtype_of(table)
    metadata = ShardedTensorMetadata(
        shards_metadata=[_metadata(s, s.rank, env, device) for s in spec],
        size=torch.Size(table.global_shape),
        tensor_properties=TensorProperties(dtype=dtype),
    )
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, metadata, process_group=env.pg)


def _dtype_of(table: ShardedTable) -> torch.dtype:
    # A rank that holds no shard of the table still needs the table's dtype for the global metadata.
    return torch.float32


@torch.no_grad()
def load_into(key: str, table: ShardedTable, source: Any) -> None:
    """Copy ``source`` (ShardedTensor, DTensor or full tensor) into this rank's shards of ``table``."""
    if isinstance(source, DTensor):
        source = source.full_tensor()
    if isinstance(source, ShardedTensor):
        _check_shape(key, table, tuple(source.size()))
        pieces = [(s.metadata.shard_offsets, s.metadata.shard_sizes, s.tensor) for s in source.local_shards()]
        for shard, tensor in table.local_shards:
            _fill_from_pieces(key, shard, tensor, pieces)
        return
    if not isinstance(source, Tensor):
        raise ConfigError(
            f"state_dict[{key!r}]: expected a ShardedTensor, DTensor or tensor, got {type(source).__name__}"
        )
    _check_shape(key, table, tuple(source.shape))
    table.load_from_full(source)


def _check_shape(key: str, table: ShardedTable, shape: tuple[int, ...]) -> None:
    if shape != tuple(table.global_shape):
        raise ConfigError(
            f"state_dict[{key!r}]: the table has shape {list(table.global_shape)}, "
            f"the given value {list(shape)}"
        )


def _fill_from_pieces(
    key: str, shard: Shard, tensor: Tensor, pieces: list[tuple[list[int], list[int], Tensor]]
) -> None:
    """Copy every overlap of ``pieces`` with ``shard`` into ``tensor``; the overlaps must cover the shard."""
    covered = 0
    for (row, col), (rows, cols), piece in pieces:
        r0, r1 = max(row, shard.row_offset), min(row + rows, shard.row_offset + shard.num_rows)
        c0, c1 = max(col, shard.col_offset), min(col + cols, shard.col_offset + shard.num_cols)
        if r0 >= r1 or c0 >= c1:
            continue
        tensor[
            r0 - shard.row_offset : r1 - shard.row_offset, c0 - shard.col_offset : c1 - shard.col_offset
        ] = piece[r0 - row : r1 - row, c0 - col : c1 - col]
        covered += (r1 - r0) * (c1 - c0)
    if covered < shard.num_rows * shard.num_cols:
        raise ConfigError(
            f"state_dict[{key!r}]: this rank's local shards of the given ShardedTensor do not contain rows "
            f"{shard.row_offset}..{shard.row_offset + shard.num_rows}, cols {shard.col_offset}.."
            f"{shard.col_offset + shard.num_cols}; to re-shard across ranks load with "
            "torch.distributed.checkpoint, or pass the full tensor"
        )


class ShardedModule(Protocol):
    """A sharded collection: its tables as ``{key: ShardedTable}``, its env and device."""

    env: ShardingEnv
    device: torch.device

    def sharded_state(self) -> Mapping[str, ShardedTable]: ...


def install_state_dict_hooks(module: nn.Module) -> None:
    """Make ``module.state_dict()`` / ``load_state_dict`` speak TorchRec's keys and torch's types.

    ``module`` is a :class:`ShardedModule`; every state-dict entry of its own (its kernels' per-shard
    weights) is replaced by its tables under the unsharded collection's keys.
    """
    module.register_state_dict_post_hook(_save_hook)
    module.register_load_state_dict_pre_hook(_load_hook)


def _save_hook(module: ShardedModule, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for name in [k for k in state if k.startswith(prefix)]:
        del state[name]
    for name, table in module.sharded_state().items():
        state[prefix + name] = to_torch(table, module.env, module.device)


def _load_hook(
    module: ShardedModule,
    state: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    for name, table in module.sharded_state().items():
        if prefix + name in state:
            load_into(prefix + name, table, state.pop(prefix + name))
        else:
            missing_keys.append(prefix + name)
    # The kernels' own entries were just written (or are reported missing above): have the regular loading
    # copy each onto itself rather than report it missing under its internal per-shard name.
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        state.setdefault(prefix + name, tensor.detach())
