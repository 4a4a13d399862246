"""Optimizers addressed by parameter name, as ``torchrec.optim``, and the fused embedding optimizer."""

from rectrain.optim.clipping import GradientClipping, GradientClippingOptimizer
from rectrain.optim.fused import FusedEmbeddingOptimizer
from rectrain.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper, OptimizerWrapper
from rectrain.optim.optimizers import SGD, Adagrad, Adam, in_backward_optimizer_filter
from rectrain.optim.rowwise_adagrad import RowWiseAdagrad
from rectrain.optim.warmup import WarmupOptimizer, WarmupPolicy, WarmupStage

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "CombinedOptimizer",
    "FusedEmbeddingOptimizer",
    "GradientClipping",
    "GradientClippingOptimizer",
    "KeyedOptimizer",
    "KeyedOptimizerWrapper",
    "OptimizerWrapper",
    "RowWiseAdagrad",
    "WarmupOptimizer",
    "WarmupPolicy",
    "WarmupStage",
    "in_backward_optimizer_filter",
]
