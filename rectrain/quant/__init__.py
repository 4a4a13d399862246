"""``torchrec.quant``: quantized embedding collections for inference, over recserve's int-N lookups."""

from rectrain.quant.embedding_modules import EmbeddingBagCollection

__all__ = ["EmbeddingBagCollection"]
