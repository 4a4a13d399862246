"""Serving placement: which logical device holds which rows of which table (the manifest's ``placement``).

Written by the export planner (``recserve.export.planner``), read by the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from recserve.errors import PackageError


@dataclass(frozen=True)
class TableShard:
    """Rows ``[row_start, row_end)`` of ``table`` served from ``device``."""

    table: str
    device: str
    row_start: int
    row_end: int

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def rows(self) -> tuple[int, int]:
        return self.row_start, self.row_end

    @property
    def label(self) -> str:
        """``table[start:end]``: how logs and tensor keys name the shard."""
        return f"{self.table}[{self.row_start}:{self.row_end}]"


@dataclass
class ServingPlacement:
    """Every table's shards over ``devices``; the pooled outputs are gathered on ``dense_device``."""

    devices: list[str]
    dense_device: str
    shards: list[TableShard] = field(default_factory=list)

    def shards_of(self, table: str) -> list[TableShard]:
        return [shard for shard in self.shards if shard.table == table]

    def is_split(self, table: str) -> bool:
        return len(self.shards_of(table)) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "dense_device": self.dense_device,
            "shards": [asdict(shard) for shard in self.shards],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "placement") -> ServingPlacement:
        """Parse the manifest form; PackageError naming the key on anything malformed."""
        try:
            shards = [
                TableShard(str(s["table"]), str(s["device"]), int(s["row_start"]), int(s["row_end"]))
                for s in data["shards"]
            ]
            return cls([str(d) for d in data["devices"]], str(data["dense_device"]), shards)
        except (KeyError, TypeError, ValueError) as error:
            raise PackageError(f"{where}: malformed serving placement ({error!r})") from None
