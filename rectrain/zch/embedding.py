"""Embedding collections behind a ``ManagedCollisionCollection`` (``torchrec``'s MC-EC and MC-EBC).

``forward(kjt)`` remaps the ids into rows, looks the rows up and returns ``(embeddings, remapped kjt or
None)``. As in TorchRec, an unsharded collection keeps the embedding of a row handed to a new id (only the
remapper's state changes); under ``DistributedModelParallel`` such rows are re-initialised with their
optimizer state.
"""

import torch
from torch import Tensor, nn

from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from rectrain.zch.collection import ManagedCollisionCollection


def evict(evictions: dict[str, Tensor | None], ebc: nn.Module) -> None:
    """What an unsharded collection does with rows handed to new ids: nothing, as TorchRec."""


@torch.fx.wrap
def return_remapped_lengths_as_mask(features: KeyedJaggedTensor) -> Tensor:
    """True where a row of the remapped features kept an id (a remapper may drop misses)."""
    return features.lengths().to(torch.bool)


@torch.fx.wrap
def return_custom_metadata(runtime_meta: Tensor) -> Tensor:
    return runtime_meta


class BaseManagedCollisionEmbeddingCollection(nn.Module):
    """An embedding collection whose input ids are first remapped by a managed collision collection.

    Args:
        embedding_module: the ``EmbeddingBagCollection`` or ``EmbeddingCollection``.
        managed_collision_collection: remappers for exactly its tables (the same configs).
        return_remapped_features: also return the remapped KeyedJaggedTensor.
        allow_in_place_embed_weight_update: re-initialise evicted rows through ``.data`` when sharded (so
            an autograd graph built over the weights stays valid).
    """

    def __init__(
        self,
        embedding_module: EmbeddingBagCollection | EmbeddingCollection,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        allow_in_place_embed_weight_update: bool = False,
    ) -> None:
        super().__init__()
        self._managed_collision_collection = managed_collision_collection
        self._return_remapped_features = return_remapped_features
        self._allow_in_place_embed_weight_update = allow_in_place_embed_weight_update
        self._embedding_module = embedding_module
        if isinstance(embedding_module, EmbeddingBagCollection):
            tables = embedding_module.embedding_bag_configs()
        else:
            tables = embedding_module.embedding_configs()
        if list(tables) != list(managed_collision_collection.embedding_configs()):
            raise ValueError(
                f"the {type(embedding_module).__name__} and the ManagedCollisionCollection must be built "
                f"from the same table configs; got {[t.name for t in tables]} and "
                f"{[t.name for t in managed_collision_collection.embedding_configs()]}"
            )

    def forward(
        self, features: KeyedJaggedTensor, mutate_miss_lengths: bool = True
    ) -> tuple[KeyedTensor | dict[str, JaggedTensor], KeyedJaggedTensor | None]:
        features = self._managed_collision_collection(features, mutate_miss_lengths=mutate_miss_lengths)
        embeddings = self._embedding_module(features)
        evict(self._managed_collision_collection.evict(), self._embedding_module)
        if not self._return_remapped_features:
            return embeddings, None
        return embeddings, features

    def lookup_remapped_lengths_mask(self, features: KeyedJaggedTensor) -> Tensor:
        features = self._managed_collision_collection(features, mutate_miss_lengths=True)
        return return_remapped_lengths_as_mask(features)

    def lookup_remapped_lengths_mask_and_runtime_meta(
        self, features: KeyedJaggedTensor
    ) -> tuple[Tensor, Tensor]:
        features = self._managed_collision_collection(features, mutate_miss_lengths=True)
        meta = self._managed_collision_collection.lookup_custom_runtime_meta(features)
        return return_remapped_lengths_as_mask(features), return_custom_metadata(meta)


class ManagedCollisionEmbeddingCollection(BaseManagedCollisionEmbeddingCollection):
    """An ``EmbeddingCollection`` behind managed collision remapping (outputs as ``EmbeddingCollection``)."""

    def __init__(
        self,
        embedding_collection: EmbeddingCollection,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        allow_in_place_embed_weight_update: bool = False,
    ) -> None:
        super().__init__(
            embedding_collection,
            managed_collision_collection,
            return_remapped_features,
            allow_in_place_embed_weight_update,
        )

    @property
    def _embedding_collection(self) -> EmbeddingCollection:
        return self._embedding_module


class ManagedCollisionEmbeddingBagCollection(BaseManagedCollisionEmbeddingCollection):
    """An ``EmbeddingBagCollection`` behind managed collision remapping (a ``KeyedTensor`` out)."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        allow_in_place_embed_weight_update: bool = False,
    ) -> None:
        super().__init__(
            embedding_bag_collection,
            managed_collision_collection,
            return_remapped_features,
            allow_in_place_embed_weight_update,
        )

    @property
    def _embedding_bag_collection(self) -> EmbeddingBagCollection:
        return self._embedding_module
