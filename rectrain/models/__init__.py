"""Recommendation models built on rectrain's sparse modules (TorchRec's ``torchrec.models``).

``ModelConfig`` + ``build_model`` / ``build_train_model`` build any kind from a config; the classes are
TorchRec's architectures: ``DLRM``, ``DLRM_DCN`` (with ``LowRankCrossNet``), ``TwoTower``.
"""

from rectrain.models.batch import Batch
from rectrain.models.config import MODEL_KINDS, ModelConfig
from rectrain.models.crossnet import CrossNet, LowRankCrossNet
from rectrain.models.dlrm import (
    DLRM,
    DLRM_DCN,
    DenseArch,
    DLRMPrediction,
    DLRMTrain,
    InteractionArch,
    InteractionDCNArch,
    OverArch,
    SparseArch,
)
from rectrain.models.factory import PREDICTION_PREFIX, build_model, build_train_model
from rectrain.models.mlp import MLP, Perceptron
from rectrain.models.two_tower import (
    TwoTower,
    TwoTowerPrediction,
    TwoTowerTrainTask,
    evaluate_recall_at_k,
    in_batch_softmax_loss,
)

__all__ = [
    "DLRM",
    "DLRM_DCN",
    "MLP",
    "MODEL_KINDS",
    "PREDICTION_PREFIX",
    "Batch",
    "CrossNet",
    "DLRMPrediction",
    "DLRMTrain",
    "DenseArch",
    "InteractionArch",
    "InteractionDCNArch",
    "LowRankCrossNet",
    "ModelConfig",
    "OverArch",
    "Perceptron",
    "SparseArch",
    "TwoTower",
    "TwoTowerPrediction",
    "TwoTowerTrainTask",
    "build_model",
    "build_train_model",
    "evaluate_recall_at_k",
    "in_batch_softmax_loss",
]
