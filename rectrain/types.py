"""``torchrec.types`` at rectrain's path: ``DataType`` (``rectrain.embedding.config``)."""

from rectrain.embedding.config import DataType

__all__ = ["DataType"]
