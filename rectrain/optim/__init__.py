"""Optimizers addressed by name, TorchRec-style: keyed, combined, and the fused embedding optimizer."""

from rectrain.optim.fused import FusedEmbeddingOptimizer
from rectrain.optim.keyed import CombinedOptimizer, KeyedOptimizer

__all__ = ["CombinedOptimizer", "FusedEmbeddingOptimizer", "KeyedOptimizer"]
