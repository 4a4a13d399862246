"""Recommendation models built on rectrain's sparse modules (TorchRec's ``torchrec.models``)."""

from rectrain.models.batch import Batch
from rectrain.models.dlrm import DLRM, DenseArch, DLRMTrain, InteractionArch, OverArch, SparseArch
from rectrain.models.mlp import MLP, Perceptron

__all__ = [
    "DLRM",
    "MLP",
    "Batch",
    "DLRMTrain",
    "DenseArch",
    "InteractionArch",
    "OverArch",
    "Perceptron",
    "SparseArch",
]
