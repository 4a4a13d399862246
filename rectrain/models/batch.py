"""``Batch``: one training batch of a recommendation model (``torchrec.datasets.utils.Batch``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rectrain.sparse import KeyedJaggedTensor


@dataclass
class Batch:
    """Dense features ``[B, dense_in_features]``, sparse features (a KJT of stride B) and labels ``[B]``.

    ``to``, ``pin_memory`` and ``record_stream`` act on all three, so a pipeline can move a batch as one unit.
    """

    dense_features: Tensor
    sparse_features: KeyedJaggedTensor
    labels: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        _count_on_host(self.sparse_features)
        return Batch(
            dense_features=self.dense_features.to(device, non_blocking=non_blocking),
            sparse_features=self.sparse_features.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        _count_on_host(self.sparse_features)
        return Batch(
            self.dense_features.pin_memory(), self.sparse_features.pin_memory(), self.labels.pin_memory()
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.dense_features.record_stream(stream)
        self.sparse_features.record_stream(stream)
        self.labels.record_stream(stream)


def _count_on_host(kjt: KeyedJaggedTensor) -> None:
    """Count each key's ids while the batch is on the host (cached, and carried by the copy): a GPU step
    then slices features without reading the device (``FeatureRouter.route``)."""
    if kjt.values().device.type == "cpu":
        kjt.length_per_key()
