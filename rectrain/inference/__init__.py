"""``torchrec.inference`` at rectrain's path: moving a trained sharded state dict into an unsharded model
(``state_dict_transform``). rectrain's serving lives in ``recserve``."""

from rectrain.inference import state_dict_transform

__all__ = ["state_dict_transform"]
