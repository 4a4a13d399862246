"""``torchrec.inference``: from a trained (sharded) model to one recserve serves, quantized or not.

``state_dict_transform`` gathers a sharded state dict into an unsharded model; ``modules`` quantizes its
collections (``quantize_embeddings``) into recserve's int-N lookups; ``model_packager`` (torch.package)
is refused by name: rectrain's packaged model is a recserve model package (``recserve.export``).
"""

from rectrain.inference import model_packager, modules, state_dict_transform

__all__ = ["model_packager", "modules", "state_dict_transform"]
