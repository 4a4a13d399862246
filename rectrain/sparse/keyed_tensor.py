"""KeyedTensor: dense per-key tensors (typically pooled embeddings) side by side along one dimension, and the
regroup operations that gather keys of several KeyedTensors into new groups.

Same API and behaviour as ``torchrec.sparse.jagged_tensor.KeyedTensor`` (and its module-level regroup
functions): key i owns ``length_per_key[i]`` consecutive slices of ``values`` along ``key_dim`` (pooled
embeddings: values [B, sum(D)], key_dim 1). TorchScript-compatible; the regroup functions are ``torch.fx``
leaves.
"""

import torch
from torch import Tensor

from rectrain.sparse import formatting, jagged_ops, validation
from rectrain.sparse.jagged import JaggedTensorMeta


class KeyedTensor(metaclass=JaggedTensorMeta):
    """Dense tensors of several keys laid side by side along ``key_dim``.

    ``validate=True`` checks now that the keys are unique and ``length_per_key`` tiles ``values`` (as does
    ``debug_checks``, unless ``validate=False``); the constructor otherwise only stores its arguments.
    """

    def __init__(
        self,
        keys: list[str],
        length_per_key: list[int],
        values: Tensor,
        key_dim: int = 1,
        offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
        validate: bool | None = None,
    ) -> None:
        self._keys: list[str] = keys
        self._length_per_key: list[int] = length_per_key
        self._values: Tensor = values
        self._key_dim: int = key_dim
        self._offset_per_key: list[int] | None = offset_per_key
        self._index_per_key: dict[str, int] | None = index_per_key
        if not torch.jit.is_scripting():
            validation.construction_checks_dense(self, validate)

    @torch.jit.unused
    def validate(self) -> "KeyedTensor":
        """Raise ValueError naming the problem unless the keys are unique and ``length_per_key`` tiles
        ``values`` along ``key_dim``; returns self."""
        validation.validate_keyed_tensor(self)
        return self

    @staticmethod
    def from_tensor_list(
        keys: list[str], tensors: list[Tensor], key_dim: int = 1, cat_dim: int = 1
    ) -> "KeyedTensor":
        """Concatenate ``tensors[i]`` (key i) along ``cat_dim``; key i spans ``tensors[i].size(key_dim)``."""
        if len(keys) != len(tensors):
            raise ValueError(f"from_tensor_list got {len(keys)} keys but {len(tensors)} tensors")
        length_per_key = [tensor.shape[key_dim] for tensor in tensors]
        return KeyedTensor(
            keys=keys, length_per_key=length_per_key, values=torch.cat(tensors, dim=cat_dim), key_dim=key_dim
        )

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def device(self) -> torch.device:
        return self._values.device

    def length_per_key(self) -> list[int]:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """Start of each key along ``key_dim``, plus the total (keys + 1 entries)."""
        offset_per_key = self._offset_per_key
        if offset_per_key is None:
            offset_per_key = jagged_ops.cumsum(self._length_per_key)
            self._offset_per_key = offset_per_key
        return offset_per_key

    def _key_indices(self) -> dict[str, int]:
        index_per_key = self._index_per_key
        if index_per_key is None:
            index_per_key = {key: i for i, key in enumerate(self._keys)}
            self._index_per_key = index_per_key
        return index_per_key

    def index_per_key(self) -> dict[str, int]:
        """Position of each key in ``keys()``."""
        return self._key_indices()

    def size_in_bytes(self) -> int:
        return self._values.element_size() * self._values.numel()

    def __getitem__(self, key: str) -> Tensor:
        """The slice of ``values`` that belongs to ``key`` (a view)."""
        index_per_key = self._key_indices()
        if key not in index_per_key:
            raise KeyError(f"key {key} is not in this KeyedTensor; keys are {self._keys}")
        index = index_per_key[key]
        start = self.offset_per_key()[index]
        return self._values.narrow(dim=self._key_dim, start=start, length=self._length_per_key[index])

    def to_dict(self) -> dict[str, Tensor]:
        """Each key's slice (views)."""
        parts = self._values.split(self._length_per_key, dim=self._key_dim)
        return {key: parts[index] for key, index in self._key_indices().items()}

    @staticmethod
    def regroup(keyed_tensors: list["KeyedTensor"], groups: list[list[str]]) -> list[Tensor]:
        """One tensor per group: the group's keys gathered from ``keyed_tensors``, concatenated on key_dim.
        A key may appear in several groups, or in none."""
        if _all_keys_used_once(keyed_tensors, groups) is True:
            return _fbgemm_permute_pooled_embs(keyed_tensors, groups)
        return _regroup_keyed_tensors(keyed_tensors, groups)

    @staticmethod
    def regroup_as_dict(
        keyed_tensors: list["KeyedTensor"], groups: list[list[str]], keys: list[str]
    ) -> dict[str, Tensor]:
        """``regroup`` with the i-th group's tensor named ``keys[i]``."""
        if len(groups) != len(keys):
            raise ValueError(f"regroup_as_dict got {len(groups)} groups but {len(keys)} keys")
        grouped = KeyedTensor.regroup(keyed_tensors, groups)
        result: dict[str, Tensor] = {}
        for i, key in enumerate(keys):
            result[key] = grouped[i]
        return result

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        self._values.record_stream(stream)

    def to(self, device: torch.device, non_blocking: bool = False) -> "KeyedTensor":
        """A copy with ``values`` on ``device``."""
        return KeyedTensor(
            keys=self._keys,
            length_per_key=self._length_per_key,
            values=self._values.to(device, non_blocking=non_blocking),
            key_dim=self._key_dim,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            validate=None,  # TorchScript applies no defaults to a class's own constructor in its methods
        )

    @torch.jit.unused
    def __str__(self) -> str:
        return formatting.keyed_text(self._keys, [self[key] for key in self._keys])

    @torch.jit.unused
    def __repr__(self) -> str:
        return self.__str__()


# ------------------------------------------------------------------------------- regroup (TorchRec's names)


@torch.fx.wrap
def _desugar_keyed_tensors(kts: list[KeyedTensor]) -> tuple[list[list[str]], list[list[int]], list[Tensor]]:
    """(keys, length_per_key, values) of each KeyedTensor."""
    return [kt.keys() for kt in kts], [kt.length_per_key() for kt in kts], [kt.values() for kt in kts]


@torch.fx.wrap
def _all_keys_used_once(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> bool:
    """True if every key of the inputs appears in exactly one group, once (the permute fast path)."""
    flat_keys: list[str] = []
    flat_groups: list[str] = []
    for kt in keyed_tensors:
        flat_keys.extend(kt.keys())
    for group in groups:
        flat_groups.extend(group)
    key_set: dict[str, int] = {key: 1 for key in flat_keys}
    group_set: dict[str, int] = {key: 1 for key in flat_groups}
    return len(key_set) == len(group_set) == len(flat_keys) == len(flat_groups)


@torch.fx.wrap
def _regroup_keyed_tensors(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[Tensor]:
    """Regroup by slicing each key and one concatenation (any keys, repeats and omissions allowed)."""
    key_dim = keyed_tensors[0].key_dim()
    location: dict[str, int] = {}
    for i, kt in enumerate(keyed_tensors):
        for key in kt.keys():  # noqa: SIM118 (a list; TorchScript cannot iterate a KeyedTensor)
            location[key] = i
    parts: list[Tensor] = []
    split_sizes: list[int] = []
    for group in groups:
        width = 0
        for key in group:
            if key not in location:
                raise ValueError(f"regroup: key {key} is not in any KeyedTensor")
            kt = keyed_tensors[location[key]]
            parts.append(kt[key])
            width += kt.length_per_key()[kt._key_indices()[key]]
        split_sizes.append(width)
    return list(torch.cat(parts, key_dim).split(split_sizes, dim=key_dim))


@torch.fx.wrap
def permute_multi_embedding(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[Tensor]:
    """Regroup with FBGEMM's ``permute_multi_embedding`` (keys may repeat across groups)."""
    keys, lengths, values = _desugar_keyed_tensors(keyed_tensors)
    permutes, in_shape, out_shape, out_lengths = torch.ops.fbgemm.kt_regroup_arguments(
        values[0], keys, lengths, groups
    )
    return torch.ops.fbgemm.permute_multi_embedding(values, permutes, in_shape, out_shape, out_lengths)


@torch.fx.wrap
def regroup_kts(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[Tensor]:
    """Regroup with FBGEMM's ``regroup_keyed_tensor``."""
    keys, lengths, values = _desugar_keyed_tensors(keyed_tensors)
    return torch.ops.fbgemm.regroup_keyed_tensor(values, keys, lengths, groups)


@torch.fx.wrap
def _fbgemm_permute_pooled_embs(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[Tensor]:
    """Regroup with FBGEMM's ``permute_pooled_embs`` (every key used exactly once, key_dim 1)."""
    keys, lengths, values = _desugar_keyed_tensors(keyed_tensors)
    permute, inv_permute, offsets, inv_offsets, splits = _remap_to_groups(keys, lengths, groups)
    cat = torch.cat(values, dim=1)
    device = cat.device
    permuted = torch.ops.fbgemm.permute_pooled_embs_auto_grad(
        cat, offsets.to(device), permute.to(device), inv_offsets.to(device), inv_permute.to(device)
    )
    return list(torch.split(permuted, splits, dim=1))


@torch.fx.wrap
def _remap_to_groups(
    keys: list[list[str]], key_lengths: list[list[int]], groups: list[list[str]]
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[int]]:
    """(permute, inverse permute, offsets, inverse offsets, group widths) for ``permute_pooled_embs``."""
    lengths: list[int] = []
    flat_keys: list[str] = []
    for part in key_lengths:
        lengths.extend(part)
    for part_keys in keys:
        flat_keys.extend(part_keys)
    position = {key: i for i, key in enumerate(flat_keys)}
    permute: list[int] = []
    splits: list[int] = []
    for group in groups:
        width = 0
        for key in group:
            permute.append(position[key])
            width += lengths[position[key]]
        splits.append(width)
    inverse = [0] * len(permute)
    for i, p in enumerate(permute):
        inverse[p] = i
    permuted_lengths = [lengths[i] for i in permute]
    return (
        torch.tensor(permute, dtype=torch.int64),
        torch.tensor(inverse, dtype=torch.int64),
        torch.tensor(jagged_ops.cumsum(lengths), dtype=torch.int64),
        torch.tensor(jagged_ops.cumsum(permuted_lengths), dtype=torch.int64),
        splits,
    )


def _kt_regroup_arguments(
    value: Tensor, keys: list[list[str]], key_lengths: list[list[int]], groups: list[list[str]]
) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """(permutes, in_shapes, out_shapes, out_lengths): the arguments of FBGEMM's ``permute_multi_embedding``
    for these keys and groups, on ``value``'s device."""
    return torch.ops.fbgemm.kt_regroup_arguments(value, keys, key_lengths, groups)
