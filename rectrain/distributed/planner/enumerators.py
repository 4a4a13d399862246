"""``torchrec.distributed.planner.enumerators`` at rectrain's path: the planner's one enumerator
(``rectrain.planner.enumerate``), whose ``enumerate(module, sharders)`` is TorchRec's API."""

from rectrain.planner.enumerate import (
    GUARDED_COMPUTE_KERNELS,
    GUARDED_SHARDING_TYPES_FOR_FP_MODULES,
    EmbeddingEnumerator,
)

__all__ = ["GUARDED_COMPUTE_KERNELS", "GUARDED_SHARDING_TYPES_FOR_FP_MODULES", "EmbeddingEnumerator"]
