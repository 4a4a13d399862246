"""``torchrec.modules.embedding_modules`` at rectrain's path (implementations in ``rectrain.embedding``)."""

from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.embedding.layout import get_embedding_names_by_table

__all__ = ["EmbeddingBagCollection", "EmbeddingCollection", "get_embedding_names_by_table"]
