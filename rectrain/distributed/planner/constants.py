"""``torchrec.distributed.planner.constants`` at rectrain's path: the defaults TorchRec's planner API assumes.

Capacities and bandwidths are rectrain's own topology defaults (``rectrain.planner.topology``); the rest are
the figures TorchRec's estimators are documented to use.
"""

from rectrain.planner.constraints import POOLING_FACTOR
from rectrain.planner.enumerate import MIN_CW_DIM
from rectrain.planner.topology import BWD_COMPUTE_MULTIPLIER, DDR_CAP, HBM_CAP

BIGINT_DTYPE: int = 8  # bytes of one input id: FBGEMM's kernels take int64 ids (int32 ids are widened)
NUM_POOLINGS: float = 1.0  # poolings per example per feature when the constraints give none
UVM_CACHING_RATIO: float = 0.2  # share of a UVM-cached table's rows its HBM cache holds by default
KV_CACHING_RATIO: float = 0.2  # the same for key-value (virtual) tables
BATCH_SIZE: int = 512  # per-rank batch size when the caller gives none
SSD_CAP: int = 2 * 1024**4
MAX_SIZE: int = (1 << 63) - 1

__all__ = [
    "BATCH_SIZE",
    "BIGINT_DTYPE",
    "BWD_COMPUTE_MULTIPLIER",
    "DDR_CAP",
    "HBM_CAP",
    "KV_CACHING_RATIO",
    "MAX_SIZE",
    "MIN_CW_DIM",
    "NUM_POOLINGS",
    "POOLING_FACTOR",
    "SSD_CAP",
    "UVM_CACHING_RATIO",
]
