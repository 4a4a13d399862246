"""``torchrec.modules.mc_embedding_modules`` at rectrain's path (in ``rectrain.zch.embedding``)."""

from rectrain.zch.collection import ManagedCollisionCollection  # TorchRec's module imports it too
from rectrain.zch.embedding import (
    BaseManagedCollisionEmbeddingCollection,
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
    evict,
    return_custom_metadata,
    return_remapped_lengths_as_mask,
)

__all__ = [
    "BaseManagedCollisionEmbeddingCollection",
    "ManagedCollisionCollection",
    "ManagedCollisionEmbeddingBagCollection",
    "ManagedCollisionEmbeddingCollection",
    "evict",
    "return_custom_metadata",
    "return_remapped_lengths_as_mask",
]
