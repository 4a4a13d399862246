"""``maybe_td_to_kjt`` (TorchRec's ``torchrec.sparse.tensor_dict``): a TensorDict of jagged nested tensors
as a KeyedJaggedTensor. ``tensordict`` is optional: without it every input is returned unchanged."""

from __future__ import annotations

import torch

from rectrain.sparse.keyed_jagged import KeyedJaggedTensor


def maybe_td_to_kjt(features: KeyedJaggedTensor, keys: list[str] | None = None) -> KeyedJaggedTensor:
    """``features`` itself unless it is a ``tensordict.TensorDict`` of jagged nested tensors; then a KJT of
    its ``keys`` (default: all, in the TensorDict's order)."""
    if torch.jit.is_scripting() or isinstance(features, KeyedJaggedTensor):
        return features
    try:
        from tensordict import TensorDict
    except ImportError:
        return features
    if not isinstance(features, TensorDict):
        return features
    keys = list(features.keys()) if keys is None else keys
    parts = [features[key] for key in keys]
    lengths = [part._lengths if part._lengths is not None else torch.diff(part._offsets) for part in parts]
    return KeyedJaggedTensor(
        keys=keys, values=torch.cat([part._values for part in parts]), lengths=torch.cat(lengths)
    )
