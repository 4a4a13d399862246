"""``torchrec.distributed.planner.constants`` at rectrain's path: the defaults TorchRec's planner API assumes.

Capacities and bandwidths are the engine's topology defaults (``rectrain.planner.topology``, TorchRec's
figures); the rest are the figures TorchRec's estimators are documented to use.
"""

from rectrain.planner.constraints import POOLING_FACTOR
from rectrain.planner.context_hash import HUNDRED_GB
from rectrain.planner.shard_estimators import BIGINT_DTYPE, KV_CACHING_RATIO, NUM_POOLINGS, UVM_CACHING_RATIO
from rectrain.planner.shard_shapes import MIN_CW_DIM
from rectrain.planner.topology import (
    BWD_COMPUTE_MULTIPLIER,
    DDR_CAP,
    DDR_MEM_BW,
    HBM_CAP,
    HBM_MEM_BW,
    HBM_TO_DDR_MEM_BW,
    SSD_CAP,
    SSD_MEM_BW,
    WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER,
)
from rectrain.planner.topology import INTER_HOST_BW as CROSS_NODE_BANDWIDTH
from rectrain.planner.topology import INTRA_HOST_BW as INTRA_NODE_BANDWIDTH
from rectrain.planner.types import EmbeddingComputeKernel as _K

BATCH_SIZE: int = 512  # per-rank batch size when the caller gives none
MAX_SIZE: int = (1 << 63) - 1
DEFAULT_PERF_ESTIMATOR: str = "default_estimator"


def kernel_bw_lookup(
    compute_device: str,
    compute_kernel: str,
    hbm_mem_bw: float,
    ddr_mem_bw: float,
    hbm_to_ddr_mem_bw: float,
    caching_ratio: float | None = None,
    prefetch_pipeline: bool = False,
    ssd_mem_bw: float = SSD_MEM_BW,
) -> float | None:
    """TorchRec's lookup bandwidth of a kernel on a device (None for a pair it has no figure for)."""
    ratio = UVM_CACHING_RATIO if caching_ratio is None else caching_ratio
    cached = (ratio * hbm_mem_bw + (1 - ratio) * hbm_to_ddr_mem_bw) / 10
    if prefetch_pipeline and compute_device == "cuda" and compute_kernel == _K.FUSED_UVM_CACHING.value:
        compute_kernel = _K.FUSED.value  # the pipeline prefetches the cache ahead: HBM speed
    host = "cpu" if compute_device == "cpu" else "device"
    lookup = {
        ("cpu", _K.DENSE): 0.5 * ddr_mem_bw, ("cpu", _K.FUSED): ddr_mem_bw, ("cpu", _K.QUANT): ddr_mem_bw,
        ("device", _K.DENSE): 0.5 * hbm_mem_bw, ("device", _K.FUSED): hbm_mem_bw,
        ("device", _K.QUANT): hbm_mem_bw,
    }  # fmt: skip
    if compute_device == "cuda":
        lookup |= {
            (host, _K.FUSED_TRITON): hbm_mem_bw, (host, _K.FUSED_UVM): hbm_to_ddr_mem_bw / 10,
            (host, _K.QUANT_UVM): hbm_to_ddr_mem_bw / 10, (host, _K.FUSED_UVM_CACHING): cached,
            (host, _K.QUANT_UVM_CACHING): cached, (host, _K.KEY_VALUE): ssd_mem_bw,
            (host, _K.SSD_VIRTUAL_TABLE): hbm_to_ddr_mem_bw, (host, _K.DRAM_VIRTUAL_TABLE): hbm_to_ddr_mem_bw,
            (host, _K.DRAM_SSD_VIRTUAL_TABLE): hbm_to_ddr_mem_bw,
        }  # fmt: skip
    if compute_device not in ("cpu", "cuda", "mtia"):
        return None
    return next(
        (bw for (device, k), bw in lookup.items() if device == host and k.value == compute_kernel), None
    )


__all__ = [
    "BATCH_SIZE",
    "BIGINT_DTYPE",
    "BWD_COMPUTE_MULTIPLIER",
    "CROSS_NODE_BANDWIDTH",
    "DDR_MEM_BW",
    "DEFAULT_PERF_ESTIMATOR",
    "DDR_CAP",
    "HBM_CAP",
    "HBM_MEM_BW",
    "HUNDRED_GB",
    "HBM_TO_DDR_MEM_BW",
    "INTRA_NODE_BANDWIDTH",
    "KV_CACHING_RATIO",
    "MAX_SIZE",
    "MIN_CW_DIM",
    "NUM_POOLINGS",
    "POOLING_FACTOR",
    "SSD_CAP",
    "SSD_MEM_BW",
    "UVM_CACHING_RATIO",
    "WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER",
    "kernel_bw_lookup",
]
