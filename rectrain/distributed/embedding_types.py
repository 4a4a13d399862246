"""``torchrec.distributed.embedding_types`` at rectrain's path: the compute kernels a plan names, and
``KJTList``."""

from rectrain.distributed.kjt_list import KJTList
from rectrain.planner.types import EmbeddingComputeKernel

__all__ = ["EmbeddingComputeKernel", "KJTList"]
