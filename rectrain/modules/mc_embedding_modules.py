"""``torchrec.modules.mc_embedding_modules`` at rectrain's path (in ``rectrain.zch.embedding``)."""

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
    "ManagedCollisionEmbeddingBagCollection",
    "ManagedCollisionEmbeddingCollection",
    "evict",
    "return_custom_metadata",
    "return_remapped_lengths_as_mask",
]
