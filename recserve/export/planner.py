"""Serving placement planner: which device holds which rows of which quantized table.

Independent of how training was sharded. Tables go whole to one device (table-wise), greedily balancing
memory and lookup load; a table that fits on no single device is split row-wise over the devices with the most
free memory. Device names are logical: ``"cuda:0"``, ``"cuda:1"``, or several CPU "devices" ``"cpu:0"``,
``"cpu:1"`` (which all run on the host; useful to test multi-device serving without GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from recserve.errors import ExportError
from recserve.runtime.placement import ServingPlacement, TableShard


@dataclass(frozen=True)
class TableLoad:
    """What placement needs to know of one table: its size and how many ids an example looks up in it."""

    name: str
    num_embeddings: int
    row_bytes: int
    lookups: float = 1.0

    @property
    def nbytes(self) -> int:
        return self.num_embeddings * self.row_bytes


def check_devices(devices: Sequence[str]) -> list[str]:
    """The device names, validated: non-empty, unique, each a torch device of type cpu or cuda."""
    devices = [str(d).strip() for d in devices]
    if not devices:
        raise ExportError("devices is empty: name at least one serving device (e.g. cpu or cuda:0)")
    if len(set(devices)) != len(devices):
        raise ExportError(f"devices has duplicates: {devices}")
    for name in devices:
        try:
            kind = torch.device(name).type
        except RuntimeError:
            kind = None
        if kind not in ("cpu", "cuda"):
            raise ExportError(f"devices: {name!r} is not a cpu or cuda device (e.g. cpu, cpu:1, cuda:0)")
    return devices


def default_capacity(device: str) -> float:
    """Bytes placement may use on ``device``: 90% of a visible GPU's memory; unbounded on CPU."""
    parsed = torch.device(device)
    if parsed.type == "cuda" and torch.cuda.is_available():
        index = parsed.index if parsed.index is not None else 0
        return 0.9 * torch.cuda.get_device_properties(index).total_memory
    return math.inf


def plan_placement(
    tables: Sequence[TableLoad],
    devices: Sequence[str],
    *,
    capacity_bytes: Mapping[str, float] | None = None,
    dense_device: str | None = None,
) -> ServingPlacement:
    """Place ``tables`` on ``devices``: whole tables first, largest first, each on the device where the sum
    of its memory share and lookup share (fractions of the totals) stays lowest; a table that fits nowhere
    whole is split row-wise. ``capacity_bytes`` overrides ``default_capacity`` per device."""
    devices = check_devices(devices)
    capacity = {d: float((capacity_bytes or {}).get(d, default_capacity(d))) for d in devices}
    used = dict.fromkeys(devices, 0.0)
    load = dict.fromkeys(devices, 0.0)
    total_bytes = max(1, sum(t.nbytes for t in tables))
    total_lookups = sum(t.lookups for t in tables) or 1.0
    placed: dict[str, list[TableShard]] = {}
    for table in sorted(tables, key=lambda t: (-t.nbytes, t.name)):
        fits = [d for d in devices if used[d] + table.nbytes <= capacity[d]]
        if fits:
            best = min(
                fits,
                key=lambda d: (
                    (used[d] + table.nbytes) / total_bytes + (load[d] + table.lookups) / total_lookups
                ),
            )
            placed[table.name] = [TableShard(table.name, best, 0, table.num_embeddings)]
            used[best] += table.nbytes
            load[best] += table.lookups
        else:
            placed[table.name] = _split_rows(table, devices, capacity, used, load)
    shards = [shard for table in tables for shard in placed[table.name]]
    return ServingPlacement(devices, dense_device or devices[0], shards)


def _split_rows(
    table: TableLoad,
    devices: list[str],
    capacity: Mapping[str, float],
    used: dict[str, float],
    load: dict[str, float],
) -> list[TableShard]:
    """Contiguous row ranges of ``table`` on the devices with the most free memory first."""
    free = {d: capacity[d] - used[d] for d in devices}
    free_rows = {d: int(max(0.0, free[d]) // table.row_bytes) for d in devices}
    if sum(free_rows.values()) < table.num_embeddings:
        detail = ", ".join(f"{d}: {max(0.0, free[d]):.0f}" for d in devices)
        raise ExportError(
            f"table {table.name!r} needs {table.nbytes} bytes but the serving devices have only "
            f"{detail} bytes free; add devices, or pick a smaller dtype for it (--table-dtype)"
        )
    shards, start = [], 0
    for device in sorted(devices, key=lambda d: (-free[d], devices.index(d))):
        rows = min(free_rows[device], table.num_embeddings - start)
        if rows <= 0:
            continue
        shards.append(TableShard(table.name, device, start, start + rows))
        used[device] += rows * table.row_bytes
        load[device] += table.lookups * rows / table.num_embeddings
        start += rows
        if start == table.num_embeddings:
            break
    return shards
