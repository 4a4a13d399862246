"""KeyedJaggedTensor: one JaggedTensor per feature key, stored key-major in flat tensors.

Same API and layout as ``torchrec.sparse.jagged_tensor.KeyedJaggedTensor``: ``lengths`` holds key 0's rows,
then key 1's rows, ...; ``values`` holds the ids in the same order. Each key normally has ``stride()`` rows
(the batch size). With a variable batch size per key (VBE), ``stride_per_key_per_rank`` gives every key its
own row count (summed over ranks), and every method below respects those per-key strides.

Differences from TorchRec, on purpose:
- the constructor validates its input unless ``validate=False`` (TorchRec never validates);
- ``stride_per_key`` is accepted as shorthand for ``stride_per_key_per_rank=[[s] for s in stride_per_key]``;
- ``concat`` and ``from_jt_dict`` of parts with different batch sizes give a VBE result instead of failing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from rectrain.errors import RecTrainError
from rectrain.sparse import jagged_ops, validation
from rectrain.sparse.jagged_storage import JaggedStorage
from rectrain.sparse.jagged_tensor import JaggedTensor, _format_rows

InverseIndices = tuple[list[str], Tensor]


class KeyedJaggedTensor(JaggedStorage):
    """Sparse features of a batch: for each key, a jagged row of ids (and optional weights) per example."""

    def __init__(
        self,
        keys: list[str],
        values: Tensor,
        weights: Tensor | None = None,
        lengths: Tensor | None = None,
        offsets: Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        stride_per_key: list[int] | None = None,
        length_per_key: list[int] | None = None,
        offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
        jt_dict: dict[str, JaggedTensor] | None = None,
        inverse_indices: InverseIndices | None = None,
        *,
        validate: bool = True,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("KeyedJaggedTensor needs lengths or offsets (both are None)")
        if stride_per_key is not None:
            if stride_per_key_per_rank is not None:
                raise ValueError("pass stride_per_key or stride_per_key_per_rank, not both")
            stride_per_key_per_rank = [[s] for s in stride_per_key]
        self._keys = list(keys)
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        self._stride = stride
        # An empty per-key list carries no information (no keys): treat it as a fixed stride.
        self._stride_per_key_per_rank = stride_per_key_per_rank or None
        self._length_per_key = length_per_key
        self._offset_per_key = offset_per_key
        self._index_per_key = index_per_key
        self._jt_dict = jt_dict
        self._inverse_indices = inverse_indices
        if validate:
            self._validate()

    def _validate(self) -> None:
        validation.check_kjt(
            keys=self._keys,
            values=self._values,
            weights=self._weights,
            lengths=self._lengths,
            offsets=self._offsets,
            stride=self._stride,
            stride_per_key=self.stride_per_key() if self.variable_stride_per_key() else None,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
            inverse_indices=self._inverse_indices,
        )

    # ----------------------------------------------------------------------------------------- constructors

    @staticmethod
    def from_lengths_sync(
        keys: list[str],
        values: Tensor,
        lengths: Tensor,
        weights: Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        inverse_indices: InverseIndices | None = None,
        *,
        validate: bool = True,
    ) -> KeyedJaggedTensor:
        """Build from lengths and compute length_per_key/offset_per_key now (one host sync)."""
        kjt = KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank,
            inverse_indices=inverse_indices,
            validate=validate,
        )
        return kjt.sync()

    @staticmethod
    def from_offsets_sync(
        keys: list[str],
        values: Tensor,
        offsets: Tensor,
        weights: Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        inverse_indices: InverseIndices | None = None,
        *,
        validate: bool = True,
    ) -> KeyedJaggedTensor:
        """Build from offsets and compute length_per_key/offset_per_key now (one host sync)."""
        kjt = KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            offsets=offsets,
            stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank,
            inverse_indices=inverse_indices,
            validate=validate,
        )
        return kjt.sync()

    @staticmethod
    def from_jt_dict(jt_dict: dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        """Stack per-key JaggedTensors (all weighted or none); different row counts give a VBE result."""
        if not jt_dict:
            return KeyedJaggedTensor.empty()
        keys, jts = list(jt_dict.keys()), list(jt_dict.values())
        validation.check_all_or_no_weights(keys, [jt.weights_or_none() is not None for jt in jts])
        strides = [jt.lengths().numel() for jt in jts]
        variable = len(set(strides)) > 1
        weights = [jt.weights_or_none() for jt in jts]
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([jt.values() for jt in jts]),
            weights=torch.cat(weights) if weights[0] is not None else None,
            lengths=torch.cat([jt.lengths() for jt in jts]),
            stride=None if variable else strides[0],
            stride_per_key_per_rank=[[s] for s in strides] if variable else None,
            length_per_key=[jt.values().size(0) for jt in jts],
            jt_dict=dict(jt_dict),
            validate=False,
        )

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> KeyedJaggedTensor:
        """A KeyedJaggedTensor with no keys."""
        weights = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return KeyedJaggedTensor(
            keys=[],
            values=torch.empty(0, dtype=values_dtype, device=device),
            weights=weights,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            stride=0,
            length_per_key=[],
            offset_per_key=[0],
            validate=False,
        )

    @staticmethod
    def empty_like(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """No keys, but the device, dtypes, weightedness and stride of ``kjt`` (as TorchRec's empty_like)."""
        device = kjt.device()
        weights = kjt.weights_or_none()
        return KeyedJaggedTensor(
            keys=[],
            values=torch.empty(0, device=device, dtype=kjt.values().dtype),
            weights=None if weights is None else torch.empty(0, device=device, dtype=weights.dtype),
            lengths=torch.empty(0, device=device, dtype=kjt.lengths().dtype),
            stride=kjt.stride(),
            validate=False,
        )

    @staticmethod
    def concat(kjt_list: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
        """Keys of all inputs side by side (keys must not repeat); mixed batch sizes give a VBE result."""
        if not kjt_list:
            raise ValueError("concat needs at least one KeyedJaggedTensor, got an empty list")
        if len(kjt_list) == 1:
            return kjt_list[0]
        keys: list[str] = sum((kjt.keys() for kjt in kjt_list), [])
        validation.check_keys_unique(keys)
        validation.check_all_or_no_weights(keys, [kjt.weights_or_none() is not None for kjt in kjt_list])
        strides = {kjt.stride() for kjt in kjt_list if len(kjt) > 0}
        variable = any(kjt.variable_stride_per_key() for kjt in kjt_list) or len(strides) > 1
        cached = [kjt._length_per_key for kjt in kjt_list]
        weights = [kjt.weights_or_none() for kjt in kjt_list]
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([kjt.values() for kjt in kjt_list]),
            weights=torch.cat(weights) if weights[0] is not None else None,
            lengths=torch.cat([kjt.lengths() for kjt in kjt_list]),
            stride=None if variable else next(iter(strides), kjt_list[0].stride()),
            stride_per_key_per_rank=(
                [r for kjt in kjt_list for r in kjt.stride_per_key_per_rank()] if variable else None
            ),
            length_per_key=None if None in cached else [n for lpk in cached for n in lpk],
            validate=False,
        )

    # ---------------------------------------------------------------------------------------------- access

    def keys(self) -> list[str]:
        return self._keys

    def stride(self) -> int:
        """Rows per key (the batch size); with VBE, the largest per-key stride unless given explicitly."""
        if self._stride is None:
            if self.variable_stride_per_key():
                self._stride = max(self.stride_per_key(), default=0)
            elif not self._keys:
                self._stride = 0
            else:
                num_rows = self._lengths.numel() if self._lengths is not None else self._offsets.numel() - 1
                self._stride = num_rows // len(self._keys)
        return self._stride

    def stride_per_key(self) -> list[int]:
        """Rows of each key (summed over ranks with VBE)."""
        if self._stride_per_key_per_rank is None:
            return [self.stride()] * len(self._keys)
        return [sum(ranks) for ranks in self._stride_per_key_per_rank]

    def stride_per_key_per_rank(self) -> list[list[int]]:
        """Rows of each key on each rank; without VBE, one rank holding ``stride()`` rows per key."""
        if self._stride_per_key_per_rank is None:
            return [[self.stride()] for _ in self._keys]
        return self._stride_per_key_per_rank

    def variable_stride_per_key(self) -> bool:
        """True if keys may have different row counts (built with stride_per_key[_per_rank])."""
        return self._stride_per_key_per_rank is not None

    def inverse_indices(self) -> InverseIndices:
        """(keys, [num_keys, batch] tensor) mapping deduplicated VBE rows to the batch; raises if absent."""
        if self._inverse_indices is None:
            raise RecTrainError(
                "this KeyedJaggedTensor has no inverse_indices; use inverse_indices_or_none()"
            )
        return self._inverse_indices

    def inverse_indices_or_none(self) -> InverseIndices | None:
        return self._inverse_indices

    def length_per_key(self) -> list[int]:
        """Number of values of each key (one host sync on first call, then cached)."""
        if self._length_per_key is None:
            self._length_per_key = self._length_per_key_tensor().tolist()
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """Start of each key's values in ``values()``, plus the total (len(keys) + 1 entries)."""
        if self._offset_per_key is None:
            self._offset_per_key = [0, *itertools.accumulate(self.length_per_key())]
        return self._offset_per_key

    def index_per_key(self) -> dict[str, int]:
        """Position of each key in ``keys()``."""
        if self._index_per_key is None:
            self._index_per_key = {key: i for i, key in enumerate(self._keys)}
        return self._index_per_key

    def _length_per_key_tensor(self) -> Tensor:
        """length_per_key as an int64 tensor on this device, without a host sync when not cached."""
        if self._length_per_key is not None:
            return torch.tensor(self._length_per_key, dtype=torch.int64, device=self.device())
        if not self._keys:
            return torch.empty(0, dtype=torch.int64, device=self.device())
        key_bounds = jagged_ops.segment_offsets(self.stride_per_key(), self.device())
        return jagged_ops.sum_per_segment(self.offsets(), key_bounds)

    def __getitem__(self, key: str) -> JaggedTensor:
        """The JaggedTensor of one key (a view into this KJT's tensors)."""
        index = self.index_per_key().get(key)
        if index is None:
            raise KeyError(f"key {key!r} is not in this KeyedJaggedTensor; keys are {self._keys}")
        strides = self.stride_per_key()
        row_start = sum(strides[:index])
        start, end = self.offset_per_key()[index], self.offset_per_key()[index + 1]
        return JaggedTensor(
            values=self._values[start:end],
            weights=None if self._weights is None else self._weights[start:end],
            lengths=self.lengths()[row_start : row_start + strides[index]],
            validate=False,
        )

    def to_dict(self) -> dict[str, JaggedTensor]:
        """One JaggedTensor per key (views; computed once and cached)."""
        if self._jt_dict is None:
            lpk = self.length_per_key()
            values = torch.split(self._values, lpk)
            weights = torch.split(self._weights, lpk) if self._weights is not None else [None] * len(lpk)
            lengths = torch.split(self.lengths(), self.stride_per_key())
            self._jt_dict = {
                key: JaggedTensor(values=v, weights=w, lengths=n, validate=False)
                for key, v, w, n in zip(self._keys, values, weights, lengths)
            }
        return self._jt_dict

    # -------------------------------------------------------------------------------------- restructuring

    def split(self, segments: list[int]) -> list[KeyedJaggedTensor]:
        """Split into consecutive groups of keys: ``segments[i]`` keys go to the i-th result."""
        if any(s < 0 for s in segments) or sum(segments) != len(self._keys):
            raise ValueError(
                f"segments {segments} must be non-negative and sum to the number of keys ({len(self._keys)})"
            )
        strides, lpk = self.stride_per_key(), self.length_per_key()
        row_bounds = [0, *itertools.accumulate(strides)]
        opk = self.offset_per_key()
        result = []
        for key_start, key_end in itertools.pairwise([0, *itertools.accumulate(segments)]):
            rows = slice(row_bounds[key_start], row_bounds[key_end])
            vals = slice(opk[key_start], opk[key_end])
            keys = self._keys[key_start:key_end]
            variable = self.variable_stride_per_key() and bool(keys)
            result.append(
                KeyedJaggedTensor(
                    keys=keys,
                    values=self._values[vals],
                    weights=None if self._weights is None else self._weights[vals],
                    lengths=self.lengths()[rows],
                    stride=self._stride if variable else self.stride(),
                    stride_per_key_per_rank=(
                        self._stride_per_key_per_rank[key_start:key_end] if variable else None
                    ),
                    length_per_key=lpk[key_start:key_end],
                    inverse_indices=jagged_ops.select_inverse_indices(self._inverse_indices, keys),
                    validate=False,
                )
            )
        return result

    def permute(self, indices: list[int], indices_tensor: Tensor | None = None) -> KeyedJaggedTensor:
        """Reorder keys: key ``indices[i]`` becomes key i. Keys may be repeated or dropped."""
        num_keys = len(self._keys)
        bad = [i for i in indices if not 0 <= i < num_keys]
        if bad:
            raise ValueError(f"permute indices {bad} are out of range for {num_keys} keys")
        keys = [self._keys[i] for i in indices]
        if len(set(keys)) != len(keys):
            raise ValueError(
                f"permute indices {indices} repeat a key; keys of a KeyedJaggedTensor must be unique"
            )
        device = self.device()
        if indices_tensor is None:
            indices_tensor = torch.tensor(indices, dtype=torch.int32, device=device)
        strides = torch.tensor(self.stride_per_key(), dtype=torch.int64, device=device)
        lengths, values, weights = jagged_ops.permute_segments(
            indices_tensor,
            strides,
            self.lengths(),
            self._length_per_key_tensor(),
            self._values,
            self._weights,
        )
        variable = self.variable_stride_per_key() and bool(keys)
        lpk = self._length_per_key
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=self._stride if variable else self.stride(),
            stride_per_key_per_rank=[self._stride_per_key_per_rank[i] for i in indices] if variable else None,
            length_per_key=None if lpk is None else [lpk[i] for i in indices],
            inverse_indices=jagged_ops.select_inverse_indices(self._inverse_indices, keys),
            validate=False,
        )

    # ------------------------------------------------------------------------------------ device and sync

    def to(
        self, device: torch.device | str, non_blocking: bool = False, dtype: torch.dtype | None = None
    ) -> KeyedJaggedTensor:
        """A copy on ``device``; ``dtype``, as in TorchRec, converts only the weights."""
        weights = self._weights
        if weights is not None:
            weights = weights.to(device=device, dtype=dtype or weights.dtype, non_blocking=non_blocking)
        return self._map_tensors(lambda t: t.to(device=device, non_blocking=non_blocking), weights)

    def pin_memory(self) -> KeyedJaggedTensor:
        """A copy in pinned host memory (for asynchronous host-to-device copies)."""
        weights = None if self._weights is None else self._weights.pin_memory()
        return self._map_tensors(lambda t: t.pin_memory(), weights)

    def _map_tensors(self, fn: Callable[[Tensor], Tensor], weights: Tensor | None) -> KeyedJaggedTensor:
        """A copy with ``fn`` applied to every tensor but the weights, which the caller converts."""
        inv = self._inverse_indices
        return KeyedJaggedTensor(
            keys=self._keys,
            values=fn(self._values),
            weights=weights,
            lengths=None if self._lengths is None else fn(self._lengths),
            offsets=None if self._offsets is None else fn(self._offsets),
            stride=self._stride,
            stride_per_key_per_rank=self._stride_per_key_per_rank,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            inverse_indices=None if inv is None else (inv[0], fn(inv[1])),
            validate=False,
        )

    def sync(self) -> KeyedJaggedTensor:
        """Compute and cache length_per_key and offset_per_key now (one host sync); returns self."""
        self.length_per_key()
        self.offset_per_key()
        return self

    def unsync(self) -> KeyedJaggedTensor:
        """Drop the cached length_per_key/offset_per_key so that nothing forces a sync; returns self."""
        self._length_per_key = None
        self._offset_per_key = None
        return self

    def __len__(self) -> int:
        return len(self._keys)

    def __str__(self) -> str:
        if not self._keys:
            return "KeyedJaggedTensor()"
        parts = []
        for key, jt in self.to_dict().items():
            text = f'    "{key}": {_format_rows(jt.lengths(), jt.values())}'
            if jt.weights_or_none() is not None:
                text += f" weights {_format_rows(jt.lengths(), jt.weights())}"
            parts.append(text)
        return "KeyedJaggedTensor({\n" + ",\n".join(parts) + "\n})"

    __repr__ = __str__
