"""TorchRec's ``torchrec.utils`` at rectrain's path."""
