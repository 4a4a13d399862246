"""``torchrec.distributed.batched_embedding_kernel`` at rectrain's path.

TorchRec's key-value kernels (SSD and host-memory virtual tables with zero-collision buckets) exist here by
name only: rectrain runs the ``dense`` and ``fused`` kernels, and building one of these is refused.
"""

from __future__ import annotations

from typing import Any

from rectrain.errors import ConfigError
from rectrain.planner.types import EmbeddingComputeKernel

__all__ = ["ZeroCollisionKeyValueEmbedding"]


class ZeroCollisionKeyValueEmbedding:
    """TorchRec's key-value virtual-table kernel; not available in rectrain."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(str(EmbeddingComputeKernel.DRAM_VIRTUAL_TABLE.unsupported_reason))
