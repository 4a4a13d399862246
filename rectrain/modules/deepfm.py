"""``torchrec.modules.deepfm`` at rectrain's path (implemented in ``rectrain.models.deepfm``)."""

from rectrain.models.deepfm import DeepFM, FactorizationMachine

__all__ = ["DeepFM", "FactorizationMachine"]
