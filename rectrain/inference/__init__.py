"""``torchrec.inference``'s training-side helpers: a sharded state dict into an unsharded model.

rectrain's serving lives in ``recserve``.
"""

from rectrain.inference import state_dict_transform

__all__ = ["state_dict_transform"]
