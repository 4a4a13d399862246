"""A pruned package's index remapping: which stored row serves each id of a table shard.

A package exported with ``--prune`` stores, per table shard, only the rows it kept (and, with the ``mean``
default, one default row after them), plus ``remap.safetensors``: one int32 tensor ``"<shard>.remap"`` per
shard of a pruned table, ``remap[id - shard start]`` = the stored row serving that id, or -1 (pruned, zero
default: the id adds nothing to its bag). The remap runs inside the int-N kernel (FBGEMM's
``index_remapping`` of ``IntNBitTableBatchedEmbeddingBagsCodegen``, a dense ``pruned_array_lookup``), so a
request is remapped by the same kernel call that pools it. The manifest's ``pruning`` section (see
docs/package-format.md) says how many rows each shard stores; every remap is checked against it at load,
since the serving kernels do not bounds-check the rows they read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from recserve.errors import PackageError
from recserve.runtime.placement import TableShard

REMAP_FILE = "remap.safetensors"
PRUNED_FORMAT_VERSION = 3  # a reader that does not know remaps must refuse a pruned package, not misread it
DEFAULTS = ("zero", "mean")


def remap_key(shard: TableShard) -> str:
    return f"{shard.label}.remap"


def stored_rows(pruning: dict[str, Any] | None, shard: TableShard, where: str) -> int:
    """How many rows the package stores for ``shard``: its row count, unless its table was pruned."""
    if not pruning or shard.table not in pruning.get("tables", {}):
        return shard.num_rows
    try:
        rows = pruning["shards"][shard.label]
    except (KeyError, TypeError):
        raise PackageError(f"{where}: pruning.shards has no entry for shard {shard.label!r}") from None
    if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= shard.num_rows + 1:
        raise PackageError(f"{where}: pruning.shards[{shard.label!r}] = {rows!r} is not a row count")
    return rows


def pruned_shards(pruning: dict[str, Any] | None, shards: list[TableShard]) -> list[TableShard]:
    """The shards of the pruned tables (none for an unpruned package)."""
    return [s for s in shards if pruning and s.table in pruning.get("tables", {})]


def check_remaps(
    tensors: dict[str, Tensor], path: Path, pruning: dict[str, Any], pruned: list[TableShard], where: str
) -> dict[TableShard, Tensor]:
    """The remap of every shard in ``pruned`` from ``path``'s ``tensors``, checked: int32, one entry per id of
    the shard, each -1 or a stored row of it."""
    remaps = {}
    for shard in pruned:
        remap = tensors.get(remap_key(shard))
        if remap is None:
            raise PackageError(f"{path}: has no tensor {remap_key(shard)!r}")
        if remap.dtype != torch.int32 or tuple(remap.shape) != (shard.num_rows,):
            raise PackageError(
                f"{path}: {remap_key(shard)}: expected int32 [{shard.num_rows}], got {remap.dtype} "
                f"{list(remap.shape)}"
            )
        rows = stored_rows(pruning, shard, where)
        if remap.numel() and (int(remap.min()) < -1 or int(remap.max()) >= rows):
            raise PackageError(
                f"{path}: {remap_key(shard)}: entries must be -1 or a stored row in [0, {rows}); got "
                f"[{int(remap.min())}, {int(remap.max())}]"
            )
        remaps[shard] = remap
    return remaps
