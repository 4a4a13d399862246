"""``torchrec.modules.fused_embedding_modules`` at rectrain's path: collections whose optimizer runs inside
backward, named by a torch optimizer class and its arguments.

They are rectrain's collections built with ``fused_optimizer=`` (FBGEMM's kernels update the rows during
backward; ``fused_optimizer()`` checkpoints and sets the learning rate). ``location`` may only say where
``device`` already puts the tables (``DEVICE``/``HOST``): UVM placements are refused by name. Unlike
TorchRec's, the fused collection refuses two tables of one name, as both libraries' plain collections do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rectrain.distributed.parallel.fused_params import config_from_optimizer
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection


class FusedEmbeddingBagCollection(EmbeddingBagCollection):
    def __init__(  # TorchRec's signature
        self, tables: list[EmbeddingBagConfig], optimizer_type: type, optimizer_kwargs: dict[str, Any],
        is_weighted: bool = False, device: torch.device | None = None, location: Any = None,
    ) -> None:  # fmt: skip
        config = config_from_optimizer(optimizer_type, optimizer_kwargs, type(self).__name__, location)
        super().__init__(tables, is_weighted, device, fused_optimizer=config)
        self.optimizer_type = lambda: optimizer_type
        self.optimizer_kwargs = lambda: optimizer_kwargs


class FusedEmbeddingCollection(EmbeddingCollection):
    def __init__(  # TorchRec's signature
        self, tables: list[EmbeddingConfig], optimizer_type: type, optimizer_kwargs: dict[str, Any],
        device: torch.device | None = None, need_indices: bool = False, location: Any = None,
    ) -> None:  # fmt: skip
        config = config_from_optimizer(optimizer_type, optimizer_kwargs, type(self).__name__, location)
        super().__init__(tables, device, need_indices=need_indices, fused_optimizer=config)
        self.optimizer_type = lambda: optimizer_type
        self.optimizer_kwargs = lambda: optimizer_kwargs


def fuse_embedding_optimizer(
    model: nn.Module, optimizer_type: type, optimizer_kwargs: dict[str, Any], device: torch.device,
    location: Any = None,
) -> nn.Module:  # fmt: skip
    """``model`` with every ``EmbeddingBagCollection``/``EmbeddingCollection`` replaced by its fused form
    (same tables; the new collection's weights are initialised afresh, as in TorchRec)."""
    args = {"optimizer_type": optimizer_type, "optimizer_kwargs": optimizer_kwargs, "device": device}
    if isinstance(model, (FusedEmbeddingBagCollection, FusedEmbeddingCollection)):
        return model
    if isinstance(model, EmbeddingBagCollection):
        return FusedEmbeddingBagCollection(model.embedding_bag_configs(), location=location, **args)
    if isinstance(model, EmbeddingCollection):
        return FusedEmbeddingCollection(model.embedding_configs(), location=location, **args)
    for name, child in model.named_children():
        setattr(model, name, fuse_embedding_optimizer(child, location=location, **args))
    return model


__all__ = ["FusedEmbeddingBagCollection", "FusedEmbeddingCollection", "fuse_embedding_optimizer"]
