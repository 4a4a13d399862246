"""``torchrec.distributed.planner.utils`` at rectrain's path: small helpers of TorchRec's planner API."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rectrain.distributed.parallel.sharders import BaseEmbeddingSharder
from rectrain.planner.partitioners import reset_shard_rank  # noqa: F401 (TorchRec's path)
from rectrain.planner.refusals import refusing_getattr


def prod(iterable: Iterable[int]) -> int:
    """The product of the numbers (1 for none): a shape's element count."""
    return math.prod(iterable)


def sharder_name(t: type) -> str:
    """``module.qualname`` of a module type: how TorchRec's planner keys sharders and options."""
    return f"{t.__module__}.{t.__name__}"


def bytes_to_gb(num_bytes: int) -> float:
    return float(num_bytes / (1024 * 1024 * 1024))


def bytes_to_mb(num_bytes: float) -> float:
    return float(num_bytes / (1024 * 1024))


def gb_to_bytes(gb: float) -> int:
    return int(gb * 1024 * 1024 * 1024)


def mb_to_bytes(mb: float) -> int:
    return int(mb * 1024 * 1024)


@dataclass
class SharderData:
    """What the estimators read from a sharder, copied out of it: its ``fused_params`` (the UVM cache's
    ``cache_load_factor``) and whether its UVM kernels keep the table in host memory (``"base"``: an embedding
    sharder's, as FBGEMM places it) or it stores every table on the compute device (``"default"``)."""

    fused_params: dict[str, Any] = field(default_factory=dict)
    storage_usage_type: str = "default"


def build_sharder_data(sharder: Any) -> SharderData:
    fused = getattr(sharder, "fused_params", None)
    usage = "base" if isinstance(sharder, BaseEmbeddingSharder) else "default"
    return SharderData(fused_params=dict(fused) if fused else {}, storage_usage_type=usage)


def build_sharder_data_map(sharder_map: dict[str, Any]) -> dict[str, SharderData]:
    """``{module type key: SharderData}`` for ``{module type key: sharder}``."""
    return {key: build_sharder_data(sharder) for key, sharder in sharder_map.items()}


__getattr__ = refusing_getattr(__name__)
