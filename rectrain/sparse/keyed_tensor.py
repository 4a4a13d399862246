"""KeyedTensor: dense per-key tensors (typically pooled embeddings) concatenated along one dimension.

Same API as ``torchrec.sparse.jagged_tensor.KeyedTensor``: key i owns ``length_per_key[i]`` consecutive
slices of ``values`` along ``key_dim`` (for pooled embeddings: values is [B, sum(D)], key_dim=1).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from rectrain.sparse import validation


class KeyedTensor:
    """Dense tensors of several keys laid side by side along ``key_dim``."""

    def __init__(
        self,
        keys: list[str],
        length_per_key: list[int],
        values: Tensor,
        key_dim: int = 1,
        offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
        *,
        validate: bool = True,
    ) -> None:
        if validate:
            _check_keyed_tensor(keys, length_per_key, values, key_dim)
        self._keys = list(keys)
        self._length_per_key = list(length_per_key)
        self._values = values
        self._key_dim = key_dim
        self._offset_per_key = offset_per_key
        self._index_per_key = index_per_key

    @staticmethod
    def from_tensor_list(
        keys: list[str], tensors: list[Tensor], key_dim: int = 1, cat_dim: int = 1
    ) -> KeyedTensor:
        """Concatenate ``tensors[i]`` (key i) along ``cat_dim``; key i spans ``tensors[i].size(key_dim)``."""
        if len(keys) != len(tensors):
            raise ValueError(f"from_tensor_list got {len(keys)} keys but {len(tensors)} tensors")
        length_per_key = [t.size(key_dim) for t in tensors]
        return KeyedTensor(keys, length_per_key, torch.cat(tensors, dim=cat_dim), key_dim=key_dim)

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def length_per_key(self) -> list[int]:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """Start of each key along ``key_dim``, plus the total (len(keys) + 1 entries)."""
        if self._offset_per_key is None:
            self._offset_per_key = [0, *itertools.accumulate(self._length_per_key)]
        return self._offset_per_key

    def index_per_key(self) -> dict[str, int]:
        if self._index_per_key is None:
            self._index_per_key = {key: i for i, key in enumerate(self._keys)}
        return self._index_per_key

    def device(self) -> torch.device:
        return self._values.device

    def __getitem__(self, key: str) -> Tensor:
        """The slice of ``values`` that belongs to ``key`` (a view)."""
        index = self.index_per_key().get(key)
        if index is None:
            raise KeyError(f"key {key!r} is not in this KeyedTensor; keys are {self._keys}")
        start = self.offset_per_key()[index]
        return self._values.narrow(self._key_dim, start, self._length_per_key[index])

    def to_dict(self) -> dict[str, Tensor]:
        """One tensor (view) per key."""
        parts = torch.split(self._values, self._length_per_key, dim=self._key_dim)
        return dict(zip(self._keys, parts))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedTensor:
        """A copy on ``device``."""
        return KeyedTensor(
            self._keys,
            self._length_per_key,
            self._values.to(device=device, non_blocking=non_blocking),
            key_dim=self._key_dim,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            validate=False,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark the values as in use on ``stream`` (CUDA caching allocator)."""
        self._values.record_stream(stream)

    def __str__(self) -> str:
        parts = [f'    "{key}": {tensor.tolist()}' for key, tensor in self.to_dict().items()]
        return "KeyedTensor({\n" + ",\n".join(parts) + "\n})" if parts else "KeyedTensor()"

    __repr__ = __str__

    @staticmethod
    def regroup(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[Tensor]:
        """One tensor per group: the group's keys gathered from ``keyed_tensors``, concatenated on key_dim."""
        if not keyed_tensors:
            raise ValueError("regroup needs at least one KeyedTensor, got an empty list")
        key_dim = keyed_tensors[0].key_dim()
        if any(kt.key_dim() != key_dim for kt in keyed_tensors):
            raise ValueError(f"regroup needs one key_dim, got {[kt.key_dim() for kt in keyed_tensors]}")
        location = _key_locations(keyed_tensors)
        result = []
        for group in groups:
            missing = [k for k in group if k not in location]
            if missing:
                raise ValueError(
                    f"regroup: keys {missing} are not in any KeyedTensor (have {list(location)})"
                )
            parts = [keyed_tensors[location[k]][k] for k in group]
            result.append(torch.cat(parts, dim=key_dim))
        return result

    @staticmethod
    def regroup_as_dict(
        keyed_tensors: list[KeyedTensor], groups: list[list[str]], keys: list[str]
    ) -> dict[str, Tensor]:
        """``regroup`` with the i-th group's tensor named ``keys[i]``."""
        if len(groups) != len(keys):
            raise ValueError(f"regroup_as_dict got {len(groups)} groups but {len(keys)} keys")
        validation.check_keys_unique(keys)
        return dict(zip(keys, KeyedTensor.regroup(keyed_tensors, groups)))


def _key_locations(keyed_tensors: list[KeyedTensor]) -> dict[str, int]:
    """Which KeyedTensor holds each key; a key in two of them is ambiguous and rejected."""
    location: dict[str, int] = {}
    for i, kt in enumerate(keyed_tensors):
        keys = kt.keys()
        for key in keys:
            if key in location:
                raise ValueError(f"regroup: key {key!r} is in KeyedTensors {location[key]} and {i}")
            location[key] = i
    return location


def _check_keyed_tensor(keys: list[str], length_per_key: list[int], values: Tensor, key_dim: int) -> None:
    validation.check_keys_unique(keys)
    if not -values.dim() <= key_dim < values.dim():
        raise ValueError(f"key_dim {key_dim} is out of range for values of shape {tuple(values.shape)}")
    if len(length_per_key) != len(keys):
        raise ValueError(f"length_per_key has {len(length_per_key)} entries for {len(keys)} keys")
    if any(n < 0 for n in length_per_key):
        raise ValueError(f"length_per_key must be non-negative, got {length_per_key}")
    if sum(length_per_key) != values.size(key_dim):
        raise ValueError(
            f"length_per_key sums to {sum(length_per_key)} but values has {values.size(key_dim)} "
            f"entries along key_dim {key_dim}"
        )
