"""``torchrec.modules.crossnet`` at rectrain's path (implemented in ``rectrain.models.crossnet``)."""

from rectrain.models.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet

__all__ = ["CrossNet", "LowRankCrossNet", "LowRankMixtureCrossNet", "VectorCrossNet"]
