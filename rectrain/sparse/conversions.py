"""``nn.Module`` wrappers that convert between a KeyedJaggedTensor and a dict of JaggedTensors (TorchRec's
``ComputeKJTToJTDict``/``ComputeJTDictToKJT``), so the conversion can sit in a model and be traced or
scripted with it."""

from torch import nn

from rectrain.sparse.jagged import JaggedTensor
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor


class ComputeKJTToJTDict(nn.Module):
    """``forward(kjt)`` -> ``{key: JaggedTensor}`` (each with lengths and offsets)."""

    def forward(self, keyed_jagged_tensor: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        return keyed_jagged_tensor.to_dict()


class ComputeJTDictToKJT(nn.Module):
    """``forward({key: JaggedTensor})`` -> KeyedJaggedTensor (different row counts give a VBE KJT)."""

    def forward(self, jt_dict: dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_jt_dict(jt_dict)
