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

import math
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard as TorchShard
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.distributed.tensor import DTensor

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.sharded.table import ShardedTable
from rectrain.errors import ConfigError
from rectrain.planner.types import ShardingType

Piece = tuple[list[int], list[int], Tensor]  # (offsets, sizes, tensor): one rectangle of a global tensor
_TRAINING_DTYPES = {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}


def placement(rank: int, env: ShardingEnv, device: torch.device) -> str:
    """``rank:R/<device>`` of rank ``rank``'s shards, as TorchRec writes a ``ShardMetadata`` placement."""
    if device.type == "cuda":
        # Other ranks' devices are not known here; torchrun gives rank r the device of its local rank.
        index = device.index if rank == env.rank else rank % env.local_world_size
        return f"rank:{rank}/cuda:{index}"
    return f"rank:{rank}/{device.type}"


def sharded_tensor(
    local: list[Piece],
    shards: list[tuple[list[int], list[int], int]],
    size: list[int],
    dtype: torch.dtype,
    env: ShardingEnv,
    device: torch.device,
) -> ShardedTensor:
    """A ``ShardedTensor`` of this rank's ``local`` views; ``shards``: every rank's (offsets, sizes, rank).

    Built from the plan's global metadata, so no collective runs (TorchRec builds its state the same way).
    """
    metadata = ShardedTensorMetadata(
        shards_metadata=[ShardMetadata(o, n, placement(r, env, device)) for o, n, r in shards],
        size=torch.Size(size),
        tensor_properties=TensorProperties(dtype=dtype),
    )
    pieces = [
        TorchShard(t.detach(), ShardMetadata(o, n, placement(env.rank, env, device))) for o, n, t in local
    ]
    return ShardedTensor._init_from_local_shards_and_global_metadata(pieces, metadata, process_group=env.pg)


def table_dtype(data_type: Any) -> torch.dtype:
    """The torch dtype of a trainable table's ``DataType``."""
    return _TRAINING_DTYPES[data_type.value]


def to_torch(table: ShardedTable, env: ShardingEnv, device: torch.device) -> Tensor:
    """``table`` as TorchRec shows it: a ``ShardedTensor`` of views, or a plain tensor if data-parallel."""
    if table.sharding.sharding_type is ShardingType.DATA_PARALLEL:
        (_, tensor), *_ = table.local_shards
        return tensor.detach()
    spec = [s for s in table.sharding.sharding_spec or [] if s.num_rows]  # as shard_tables_of: no empty ones
    local = [(s.shard_offsets, s.shard_sizes, t) for s, t in table.local_shards]
    if not local:
        # As TorchRec: a rank the plan gives a block of no rows (row-wise, rows not divisible by the ranks)
        # holds that empty shard; a rank the plan gives nothing (table-wise elsewhere) holds no shard.
        empty = [s for s in table.sharding.sharding_spec or [] if not s.num_rows and s.rank == env.rank]
        spec += empty
        local = [
            (s.shard_offsets, s.shard_sizes, torch.empty(s.shard_sizes, dtype=table.dtype)) for s in empty
        ]
    return sharded_tensor(
        local,
        [(s.shard_offsets, s.shard_sizes, s.rank) for s in spec],
        list(table.global_shape),
        table.dtype,
        env,
        device,
    )


@torch.no_grad()
def load_into(key: str, table: ShardedTable, source: Any) -> None:
    """Copy ``source`` (ShardedTensor, DTensor or full tensor) into this rank's shards of ``table``."""
    targets = [(s.shard_offsets, s.shard_sizes, t) for s, t in table.local_shards]
    fill(f"state_dict[{key!r}]", targets, list(table.global_shape), source)


@torch.no_grad()
def fill(where: str, targets: list[Piece], size: list[int], source: Any) -> None:
    """Copy the rectangles ``targets`` of a global tensor of ``size`` out of ``source``.

    ``source`` is a ``ShardedTensor`` (its local shards must cover the targets), a ``DTensor`` (gathered,
    a collective) or a full tensor.
    """
    if isinstance(source, DTensor):
        source = source.full_tensor()
    if isinstance(source, ShardedTensor):
        given = list(source.metadata().size)
        pieces = [(s.metadata.shard_offsets, s.metadata.shard_sizes, s.tensor) for s in source.local_shards()]
    elif isinstance(source, Tensor):
        given = list(source.shape)
        pieces = [([0] * source.dim(), given, source)]
    else:
        raise ConfigError(
            f"{where}: expected a ShardedTensor, DTensor or tensor, got {type(source).__name__}"
        )
    if given != list(size):
        raise ConfigError(f"{where}: expected shape {list(size)}, the given value has {given}")
    for offsets, sizes, tensor in targets:
        _fill_one(where, offsets, sizes, tensor, pieces)


def _fill_one(where: str, offsets: list[int], sizes: list[int], tensor: Tensor, pieces: list[Piece]) -> None:
    """Copy every overlap of ``pieces`` with one target rectangle; the overlaps must cover it."""
    covered = 0
    for piece_offsets, piece_sizes, piece in pieces:
        lo = [max(a, b) for a, b in zip(offsets, piece_offsets)]
        hi = [min(a + n, b + m) for a, n, b, m in zip(offsets, sizes, piece_offsets, piece_sizes)]
        if any(a >= b for a, b in zip(lo, hi)):
            continue
        into = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets))
        out_of = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, piece_offsets))
        tensor[into] = piece[out_of]
        covered += math.prod(b - a for a, b in zip(lo, hi))
    if covered < math.prod(sizes):
        span = ", ".join(f"{o}..{o + n}" for o, n in zip(offsets, sizes))
        raise ConfigError(
            f"{where}: this rank's local shards of the given ShardedTensor do not contain [{span}]; to "
            "re-shard across ranks load with torch.distributed.checkpoint, or pass the full tensor"
        )


class ShardedModule(Protocol):
    """A sharded collection: its tables as ``{key: ShardedTable}``, their optimizer state, env and device."""

    env: ShardingEnv
    device: torch.device

    def sharded_state(self) -> Mapping[str, ShardedTable]: ...

    def sharded_optimizer_state(self) -> Mapping[str, list[tuple[Any, dict[str, Tensor]]]]: ...


def install_state_dict_hooks(module: nn.Module) -> None:
    """Make ``module.state_dict()`` / ``load_state_dict`` speak TorchRec's keys and torch's types.

    ``module`` is a :class:`ShardedModule`; every state-dict entry of its own (its kernels' per-shard
    weights) is replaced by its tables under the unsharded collection's keys.
    """
    module.register_state_dict_post_hook(_save_hook)
    module.register_load_state_dict_pre_hook(_load_hook)


def _save_hook(module: ShardedModule, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for name, _ in [*module.named_parameters(), *module.named_buffers()]:
        state.pop(prefix + name, None)
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
