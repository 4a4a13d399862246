"""``torchrec.distributed.embedding_types`` at rectrain's path: the compute kernels a plan names."""

from rectrain.planner.types import EmbeddingComputeKernel

__all__ = ["EmbeddingComputeKernel"]
