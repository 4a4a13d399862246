"""State dicts saved with ``torch.save`` (``model.pt``), read with torch's weights-only unpickler.

TorchRec's examples save ``torch.save(model.state_dict(), "model.pt")``; after ``DistributedModelParallel``
its tables are ``ShardedTensor``s. torch's own ``ShardedTensor`` unpickles only inside a process group of
the saving job's size, so the reader maps it (and the few classes its pickle names) onto a stand-in that
keeps the rank's local shards and nothing else; ``torchrec_import`` assembles a table from them when they
cover it (a one-rank job). Nothing else outside torch's weights-only allowlist is admitted: ``getattr``,
which that pickle calls to reach ``ShardedTensor.ProcessGroupState``, is answered for that name only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.metadata import (
    MEM_FORMAT_ENCODING,
    ShardedTensorMetadata,
    TensorProperties,
)
from torch.distributed._shard.sharded_tensor.shard import Shard
from torch.distributed._shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec
from torch.distributed.remote_device import _remote_device

from recserve.errors import ExportError

_SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor.api.ShardedTensor"


@dataclass
class _ProcessGroupState:
    """What ``ShardedTensor.ProcessGroupState`` records: the saving rank and world sizes."""

    local_rank: int = 0
    global_rank: int = 0
    local_world_size: int = 1
    global_world_size: int = 1


class SavedShardedTensor(Tensor):
    """A ``ShardedTensor`` as saved by one rank: its global size and dtype, and that rank's shards."""

    ProcessGroupState = _ProcessGroupState

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # A wrapper without data of its own (torch requires the hook): its values are in local_shards().
        raise ExportError(f"{func}: a saved ShardedTensor has no values of its own; read its local_shards()")

    def __setstate__(self, state: tuple) -> None:
        self._local_shards, self._metadata, self.pg_state = state[0], state[1], state[2]

    def local_shards(self) -> list[Shard]:
        return list(self._local_shards)

    def metadata(self) -> ShardedTensorMetadata:
        return self._metadata


def _getattr(owner: object, name: str) -> object:
    if owner is SavedShardedTensor and name == "ProcessGroupState":
        return _ProcessGroupState
    raise ExportError(
        f"refusing getattr({getattr(owner, '__name__', owner)!r}, {name!r}) in a torch.save file"
    )


_ADMITTED: list[Any] = [
    (SavedShardedTensor, _SHARDED_TENSOR),
    (_getattr, "builtins.getattr"),
    _ProcessGroupState,
    Shard,
    ShardMetadata,
    ShardedTensorMetadata,
    TensorProperties,
    MEM_FORMAT_ENCODING,
    _remote_device,
    ChunkShardingSpec,
    EnumerableShardingSpec,
]


def read_torch_save(path: str | Path) -> dict[str, Any]:
    """The state dict in ``path``: tensors, and ``SavedShardedTensor`` for each sharded entry."""
    try:
        with torch.serialization.safe_globals(_ADMITTED):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except ExportError:
        raise
    except Exception as error:  # torch raises UnpicklingError, RuntimeError or zipfile errors
        raise ExportError(
            f"{path}: not a torch.save state dict that loads with weights only ({error})"
        ) from None
    if not isinstance(loaded, dict):
        raise ExportError(f"{path}: holds a {type(loaded).__name__}, not a state dict")
    return dict(loaded)
