"""``torchrec.modules.embedding_tower``: an embedding module followed by the interaction that consumes it.

A tower groups tables with the layers that read them, so that a planner can keep them together (TorchRec
shards a tower's tables within one host and runs its interaction there). Unsharded, a tower is just the two
modules in sequence. rectrain plans towers through TorchRec's enumerator API but does not shard them:
``DistributedModelParallel`` refuses the tower sharders (``rectrain.distributed.embedding_tower_sharding``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.errors import ConfigError
from rectrain.sparse import KeyedJaggedTensor


def tower_input_params(module: nn.Module) -> tuple[bool, bool]:
    """``(takes features, takes weighted features)`` of a tower's embedding module: a weighted bag
    collection reads the weighted ones, other collections the plain ones, anything else both."""
    if isinstance(module, EmbeddingCollection):
        return True, False
    if isinstance(module, EmbeddingBagCollection):
        return not module.is_weighted(), module.is_weighted()
    return True, True


class EmbeddingTower(nn.Module):
    """``interaction(embedding(*args, **kwargs))``.

    Args:
        embedding_module: the tables (an ``EmbeddingBagCollection`` or ``EmbeddingCollection``, usually).
        interaction_module: what turns their output into the tower's ``[batch, N]`` tensor.
        device: accepted for TorchRec's signature; the modules are already on theirs.
    """

    def __init__(
        self, embedding_module: nn.Module, interaction_module: nn.Module, device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.embedding = embedding_module
        self.interaction = interaction_module

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.interaction(self.embedding(*args, **kwargs))


class EmbeddingTowerCollection(nn.Module):
    """Towers run side by side; their outputs are concatenated along the feature dimension.

    Each tower gets the features its embedding module reads (``tower_input_params``).
    """

    def __init__(self, towers: list[EmbeddingTower], device: torch.device | None = None) -> None:
        super().__init__()
        self.towers = nn.ModuleList(towers)
        self._input_params = [tower_input_params(tower.embedding) for tower in towers]

    def forward(
        self,
        features: KeyedJaggedTensor | None = None,
        weighted_features: KeyedJaggedTensor | None = None,
    ) -> torch.Tensor:
        outputs = []
        for index, (tower, (plain, weighted)) in enumerate(zip(self.towers, self._input_params)):
            needed = [("features", plain, features), ("weighted_features", weighted, weighted_features)]
            missing = [name for name, wanted, given in needed if wanted and given is None]
            if missing:
                raise ConfigError(f"EmbeddingTowerCollection: tower {index} reads {' and '.join(missing)}")
            outputs.append(tower(*[given for _, wanted, given in needed if wanted]))
        return torch.cat(outputs, dim=1)

    def tower_index_of(self, table: str) -> int:
        """The index of the tower whose embedding module holds ``table``."""
        for index, tower in enumerate(self.towers):
            embedding = tower.embedding
            configs = getattr(embedding, "embedding_bag_configs", None) or embedding.embedding_configs
            if any(config.name == table for config in configs()):
                return index
        raise ConfigError(f"no tower of this EmbeddingTowerCollection holds table {table!r}")
