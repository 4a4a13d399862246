"""``torchrec.datasets.utils`` at rectrain's path: the ``Batch`` every dataset yields."""

from rectrain.models.batch import Batch

__all__ = ["Batch"]
