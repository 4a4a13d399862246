"""What the estimators read from a sharder, copied out of it (TorchRec's ``SharderData``), so estimates
need no live sharder: its ``fused_params`` (e.g. the UVM cache's ``cache_load_factor``), the element sizes
of its quantized collectives, and what kind of sharder it is (which decides where UVM tables live).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

# The collectives whose quantized codecs change the bytes a shard sends (TorchRec's ``CommOp`` names).
QCOMM_OPS = (
    "POOLED_EMBEDDINGS_ALL_TO_ALL",
    "SEQUENCE_EMBEDDINGS_ALL_TO_ALL",
    "POOLED_EMBEDDINGS_REDUCE_SCATTER",
)


class StorageUsageType(Enum):
    """The kind of sharder: an embedding sharder keeps UVM tables in host memory, as FBGEMM places them."""

    BASE_QUANT = "BaseQuantEmbeddingSharder"
    BASE = "BaseEmbeddingSharder"
    DEFAULT = "ModuleSharder"


@dataclass
class SharderData:
    fused_params: dict[str, Any] = field(default_factory=dict)
    qcomm_dtype_sizes: dict[str, tuple[float, float]] = field(default_factory=dict)
    storage_usage_type: StorageUsageType = StorageUsageType.DEFAULT


def sharder_name(t: type) -> str:
    """``module.qualname`` of a module type: how the planner keys sharders and options."""
    return f"{t.__module__}.{t.__name__}"


def build_sharder_data(sharder: Any) -> SharderData:
    fused = getattr(sharder, "fused_params", None)
    registry = getattr(sharder, "qcomm_codecs_registry", None) or {}
    sizes = {
        op: tuple(
            torch.empty(0, dtype=getattr(registry[op], d).quantized_dtype).element_size()
            for d in ("forward", "backward")
        )
        for op in QCOMM_OPS
        if op in registry
    }
    # The kind is read from the class names (StorageUsageType's values), not by importing the sharders: they
    # import the DMP machinery, which plans with this module.
    bases = {c.__name__ for c in sharder.__class__.__mro__}
    usage = next((u for u in StorageUsageType if u.value in bases), StorageUsageType.DEFAULT)
    return SharderData(dict(fused) if fused else {}, sizes, usage)


def build_sharder_data_map(sharder_map: dict[str, Any]) -> dict[str, SharderData]:
    """``{module type key: SharderData}`` for ``{module type key: sharder}``."""
    return {key: build_sharder_data(sharder) for key, sharder in sharder_map.items()}
