"""KeyedJaggedTensor: one jagged feature per key, stored key-major in flat tensors.

Same API and behaviour as ``torchrec.sparse.jagged_tensor.KeyedJaggedTensor``. ``lengths`` holds key 0's
rows, then key 1's, ...; ``values`` the ids in the same order (1-D, or 2-D rows; anything past the last
row is ignored). Every key has ``stride()`` rows, or, with a variable batch per key (VBE),
``stride_per_key_per_rank`` ([keys, ranks], summed over ranks) gives each key its own. Derived facts
(``length_per_key``, ``offset_per_key``, ...) are computed on first use and cached; ``sync()`` computes them
now. The constructor reads no tensor data; ``validate()`` checks it.
"""

import torch
from torch import Tensor

from rectrain.sparse import formatting, jagged_ops, kjt_dist, kjt_layout, kjt_ops, validation
from rectrain.sparse.jagged import JaggedTensor, JaggedTensorMeta, _weights_or_throw
from rectrain.sparse.kjt_layout import jt_dict_of as _kjt_to_jt_dict

InverseIndices = tuple[list[str], Tensor]


class KeyedJaggedTensor(metaclass=JaggedTensorMeta):
    """Sparse features of a batch: for each key, a jagged row of ids (and optional weights) per example.

    Args:
        keys: feature names (repeats are allowed, as after a permute that duplicates keys).
        values, weights, lengths, offsets: as in ``JaggedTensor``, key-major.
        stride: rows per key (the batch size); computed from the rows when not given.
        stride_per_key_per_rank: VBE: rows of each key on each rank, ``[keys, ranks]`` (list or int tensor).
        stride_per_key, length_per_key, lengths_offset_per_key, offset_per_key, index_per_key, jt_dict:
            caches of derived facts (passed by the methods that already know them).
        inverse_indices: VBE: ``(keys, [keys, batch] tensor)`` expanding deduplicated rows to the batch.
        validate: as for ``JaggedTensor`` (None: TorchRec's checks; True: ``validate()`` now; False: none).
    """

    def __init__(
        self,
        keys: list[str],
        values: Tensor,
        weights: Tensor | None = None,
        lengths: Tensor | None = None,
        offsets: Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Tensor | list[list[int]] | None = None,
        stride_per_key: list[int] | None = None,
        length_per_key: list[int] | None = None,
        lengths_offset_per_key: list[int] | None = None,
        offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
        jt_dict: dict[str, JaggedTensor] | None = None,
        inverse_indices: InverseIndices | None = None,
        validate: bool | None = None,
    ) -> None:
        self._keys: list[str] = keys
        self._values: Tensor = values
        self._weights: Tensor | None = weights
        self._lengths: Tensor | None = lengths
        self._offsets: Tensor | None = offsets
        self._stride: int | None = stride
        self._stride_per_key_per_rank: Tensor | None = (
            torch.tensor(stride_per_key_per_rank, dtype=torch.int32)
            if isinstance(stride_per_key_per_rank, list)
            else stride_per_key_per_rank
        )
        self._stride_per_key: list[int] | None = stride_per_key
        self._length_per_key: list[int] | None = length_per_key
        self._offset_per_key: list[int] | None = offset_per_key
        self._lengths_offset_per_key: list[int] | None = lengths_offset_per_key
        self._index_per_key: dict[str, int] | None = index_per_key
        self._jt_dict: dict[str, JaggedTensor] | None = jt_dict
        self._inverse_indices: InverseIndices | None = inverse_indices
        # TorchRec's override of variable_stride_per_key() (None: VBE iff stride_per_key_per_rank is set).
        self._variable_stride_per_key: bool | None = None
        if not torch.jit.is_scripting():
            validation.construction_checks(self, validate)

    @torch.jit.unused
    def validate(self) -> "KeyedJaggedTensor":
        """Raise ValueError naming the problem unless the KJT is well formed (see
        ``validation.validate_keyed_jagged_tensor``); returns self."""
        validation.validate_keyed_jagged_tensor(self)
        return self

    # ----------------------------------------------------------------------------------------- constructors

    @staticmethod
    def from_offsets_sync(
        keys: list[str],
        values: Tensor,
        offsets: Tensor,
        weights: Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        inverse_indices: InverseIndices | None = None,
    ) -> "KeyedJaggedTensor":
        """Build from offsets and compute length_per_key/offset_per_key now (one host sync)."""
        kjt = KeyedJaggedTensor(keys, values, weights, None, offsets, stride, stride_per_key_per_rank)
        kjt._inverse_indices = inverse_indices
        return kjt.sync()

    @staticmethod
    def from_lengths_sync(
        keys: list[str],
        values: Tensor,
        lengths: Tensor,
        weights: Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        inverse_indices: InverseIndices | None = None,
    ) -> "KeyedJaggedTensor":
        """Build from lengths and compute length_per_key/offset_per_key now (one host sync)."""
        kjt = KeyedJaggedTensor(keys, values, weights, lengths, None, stride, stride_per_key_per_rank)
        kjt._inverse_indices = inverse_indices
        return kjt.sync()

    @staticmethod
    def concat(kjt_list: list["KeyedJaggedTensor"]) -> "KeyedJaggedTensor":
        """Keys of all inputs side by side (all weighted or none); different batch sizes give a VBE result."""
        return _kjt_concat(kjt_list)

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "KeyedJaggedTensor":
        """A KeyedJaggedTensor with no keys."""
        weights = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return KeyedJaggedTensor(
            keys=torch.jit.annotate(list[str], []),
            values=torch.empty(0, dtype=values_dtype, device=device),
            weights=weights,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            stride=0,
        )

    @staticmethod
    def empty_like(kjt: "KeyedJaggedTensor", device: torch.device | None = None) -> "KeyedJaggedTensor":
        """No keys but ``kjt``'s dtypes and stride (VBE strides included); with ``device``, ``kjt``'s keys
        and uninitialised tensors of its shapes there."""
        if device is None:
            return _kjt_empty_like_stride(kjt)
        return _kjt_empty_like_device(kjt, device)

    @staticmethod
    def from_jt_dict(
        jt_dict: dict[str, JaggedTensor], force_variable_stride: bool = False
    ) -> "KeyedJaggedTensor":
        """Stack per-key JaggedTensors (all weighted or none); different row counts give a VBE result, as
        does ``force_variable_stride``. Synced."""
        if len(jt_dict) == 0:
            return KeyedJaggedTensor.empty()
        keys, values, weights, lengths, stride, per_rank = kjt_ops.from_jt_dict_parts(
            jt_dict, force_variable_stride
        )
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=stride,
            stride_per_key_per_rank=per_rank,
        ).sync()

    def copy_(self, kjt: "KeyedJaggedTensor", non_blocking: bool = False) -> "KeyedJaggedTensor":
        """Copy ``kjt``'s tensors into this one's in place and adopt its caches (shapes must match)."""
        self._stride_per_key_per_rank = (
            kjt._stride_per_key_per_rank if kjt.variable_stride_per_key() else None
        )
        self._length_per_key, self._offset_per_key = kjt._length_per_key, kjt._offset_per_key
        self._lengths_offset_per_key, self._stride_per_key = kjt._lengths_offset_per_key, kjt._stride_per_key
        self._index_per_key, self._jt_dict = kjt._index_per_key, kjt._jt_dict
        mine = self._inverse_indices
        theirs = kjt._inverse_indices
        kjt_layout.copy_tensors(
            [self._values, self._weights, self._lengths, self._offsets, None if mine is None else mine[1]],
            [kjt._values, kjt._weights, kjt._lengths, kjt._offsets, None if theirs is None else theirs[1]],
            non_blocking,
        )
        return self

    # ---------------------------------------------------------------------------------------------- access

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def weights(self) -> Tensor:
        """The per-value weights; RecTrainError if this KJT was built without weights."""
        return _weights_or_throw(self._weights)

    def weights_or_none(self) -> Tensor | None:
        return self._weights

    def lengths(self) -> Tensor:
        """Per-row lengths (key-major), computed from offsets on first use and cached."""
        lengths = jagged_ops.lengths_or_computed(self._lengths, self._offsets)
        self._lengths = lengths
        return lengths

    def lengths_or_none(self) -> Tensor | None:
        return self._lengths

    def offsets(self) -> Tensor:
        """Per-row offsets (rows + 1 entries), computed from lengths on first use and cached."""
        offsets = jagged_ops.offsets_or_computed(self._lengths, self._offsets)
        self._offsets = offsets
        return offsets

    def offsets_or_none(self) -> Tensor | None:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def stride(self) -> int:
        """Rows per key (the batch size); with VBE, the inverse indices' width or the largest per-key
        stride, unless given."""
        stride = kjt_layout.stride_of(
            self._keys,
            self._stride,
            self._lengths,
            self._offsets,
            self._stride_per_key_per_rank,
            self._inverse_indices,
        )
        self._stride = stride
        return stride

    def stride_per_key(self) -> list[int]:
        """Rows of each key (summed over ranks with VBE)."""
        stride_per_key = self._stride_per_key
        if stride_per_key is None:
            stride_per_key = kjt_layout.stride_per_key_of(
                self._stride_per_key_per_rank, self.stride(), self._keys, self.variable_stride_per_key()
            )
            self._stride_per_key = stride_per_key
        return stride_per_key

    def stride_per_key_per_rank(self) -> list[list[int]]:
        """VBE: rows of each key on each rank; ``[]`` without a variable stride (as TorchRec)."""
        per_rank = self._stride_per_key_per_rank
        if per_rank is None:
            return []
        per_key_per_rank: list[list[int]] = per_rank.tolist()
        return per_key_per_rank

    def variable_stride_per_key(self) -> bool:
        """True if keys may have different row counts (built with stride_per_key_per_rank)."""
        override = self._variable_stride_per_key
        if override is not None:
            return override
        return self._stride_per_key_per_rank is not None

    def inverse_indices(self) -> InverseIndices:
        """(keys, [keys, batch] tensor) mapping deduplicated VBE rows to the batch; raises if absent."""
        inverse = self._inverse_indices
        if inverse is None:
            raise ValueError("this KeyedJaggedTensor has no inverse_indices; use inverse_indices_or_none()")
        return inverse

    def inverse_indices_or_none(self) -> InverseIndices | None:
        return self._inverse_indices

    def _key_indices(self) -> dict[str, int]:
        index_per_key = self._index_per_key
        if index_per_key is None:
            index_per_key = {key: i for i, key in enumerate(self._keys)}
            self._index_per_key = index_per_key
        return index_per_key

    def index_per_key(self) -> dict[str, int]:
        """Position of each key in ``keys()``."""
        return self._key_indices()

    def length_per_key(self) -> list[int]:
        """Number of values of each key (one host sync on first call, then cached)."""
        length_per_key = self._length_per_key
        if length_per_key is None:
            length_per_key = kjt_layout.length_per_key_of(
                self._keys,
                self.stride(),
                self.stride_per_key(),
                self.variable_stride_per_key(),
                self._lengths,
                self._offsets,
                self._values,
            )
            self._length_per_key = length_per_key
        return length_per_key

    def length_per_key_or_none(self) -> list[int] | None:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """Start of each key's values in ``values()``, plus the total (keys + 1 entries)."""
        offset_per_key = self._offset_per_key
        if offset_per_key is None:
            offset_per_key = jagged_ops.cumsum(self.length_per_key())
            self._offset_per_key = offset_per_key
        return offset_per_key

    def offset_per_key_or_none(self) -> list[int] | None:
        return self._offset_per_key

    def lengths_offset_per_key(self) -> list[int]:
        """Start of each key's rows in ``lengths()``, plus the total (keys + 1 entries)."""
        lengths_offset_per_key = self._lengths_offset_per_key
        if lengths_offset_per_key is None:
            lengths_offset_per_key = jagged_ops.cumsum(self.stride_per_key())
            self._lengths_offset_per_key = lengths_offset_per_key
        return lengths_offset_per_key

    def __getitem__(self, key: str) -> JaggedTensor:
        """The JaggedTensor of one key (views into this KJT's tensors)."""
        index_per_key = self._key_indices()
        if key not in index_per_key:
            raise KeyError(f"key {key} is not in this KeyedJaggedTensor; keys are {self._keys}")
        index = index_per_key[key]
        offset_per_key = self.offset_per_key()
        start, end = offset_per_key[index], offset_per_key[index + 1]
        row_bounds = self.lengths_offset_per_key()
        kjt_layout.check_slice(self._values, start, end)
        weights = self._weights
        return JaggedTensor(
            values=self._values[start:end],
            weights=None if weights is None else weights[start:end],
            lengths=self.lengths()[row_bounds[index] : row_bounds[index + 1]],
        )

    def to_dict(self, compute_offsets: bool = True) -> dict[str, JaggedTensor]:
        """One JaggedTensor per key (views; computed once and cached); ``compute_offsets=False`` leaves
        their offsets to be computed on use."""
        jt_dict = self._jt_dict
        if jt_dict is None:
            jt_dict = _kjt_to_jt_dict(
                self._keys,
                self.stride(),
                self.stride_per_key(),
                self.length_per_key(),
                self._values,
                self.lengths(),
                self._weights,
                self.variable_stride_per_key(),
                compute_offsets,
            )
            self._jt_dict = jt_dict
        return jt_dict

    def __len__(self) -> int:
        return len(self._keys)

    def size_in_bytes(self) -> int:
        """Bytes held by the tensors (values, weights, lengths, offsets and VBE strides, where present)."""
        tensors = [self._values, self._weights, self._lengths, self._offsets, self._stride_per_key_per_rank]
        return kjt_layout.nbytes(tensors)

    # -------------------------------------------------------------------------------------- restructuring

    def split(self, segments: list[int]) -> list["KeyedJaggedTensor"]:
        """Consecutive groups of keys: ``segments[i]`` keys go to the i-th result (a segment of every key
        is this KJT itself)."""
        length_per_key, offset_per_key = self.length_per_key(), self.offset_per_key()
        row_bounds = self.lengths_offset_per_key()
        per_rank = self._stride_per_key_per_rank if self.variable_stride_per_key() else None
        weights = self._weights
        result: list[KeyedJaggedTensor] = []
        start = 0
        for segment in segments:
            end = start + segment
            part_per_rank = None if per_rank is None else per_rank[start:end]
            if segment == len(self._keys):
                result.append(self)
            elif segment == 0:
                result.append(self._empty_part(part_per_rank, True))
            else:
                lo, hi = offset_per_key[start], offset_per_key[end]
                kjt_layout.check_slice(self._values, lo, hi)
                lengths = self.lengths()[row_bounds[start] : row_bounds[end]]
                part_weights = None if weights is None else weights[lo:hi]
                part = self._derived(self._keys[start:end], self._values[lo:hi], part_weights, lengths, None)
                result.append(part._with_strides(part_per_rank, None, length_per_key[start:end]))
            start = end
        return result

    def permute(self, indices: list[int], indices_tensor: Tensor | None = None) -> "KeyedJaggedTensor":
        """Reorder keys: key ``indices[i]`` becomes key i. Keys may be repeated or dropped."""
        length_per_key = self.length_per_key()
        if len(indices) == 0 or len(self._keys) == 0:
            return self._empty_part(None, False)
        if indices_tensor is None:
            indices_tensor = torch.tensor(indices, dtype=torch.int32, device=self.device())
        permuted_length_per_key = [length_per_key[i] for i in indices]
        per_rank = self._stride_per_key_per_rank if self.variable_stride_per_key() else None
        tensors = kjt_layout.permuted_tensors(
            indices_tensor,
            self.lengths(),
            self._values,
            self._weights,
            self.stride_per_key(),
            length_per_key,
            per_rank is not None,
            kjt_layout.total(permuted_length_per_key),
        )
        stride_per_key = self._stride_per_key
        permuted = self._derived([self._keys[i] for i in indices], tensors[1], tensors[2], tensors[0], None)
        return permuted._with_strides(
            None if per_rank is None else per_rank[indices, :],
            None if stride_per_key is None else [stride_per_key[i] for i in indices],
            permuted_length_per_key,
        )

    def flatten_lengths(self) -> "KeyedJaggedTensor":
        """The same KJT with ``lengths`` viewed as 1-D."""
        flat = self._derived(self._keys, self._values, self._weights, self.lengths().view(-1), None)
        per_rank = self._stride_per_key_per_rank if self.variable_stride_per_key() else None
        return flat._with_strides(per_rank, None, self.length_per_key())

    def _derived(
        self,
        keys: list[str],
        values: Tensor,
        weights: Tensor | None,
        lengths: Tensor | None,
        offsets: Tensor | None,
    ) -> "KeyedJaggedTensor":
        """A KJT of new tensors with this one's stride (strides and caches to be set by ``_with_strides``)."""
        # TorchScript applies no defaults to a class's own constructor inside its methods: all arguments.
        # fmt: off
        return KeyedJaggedTensor(
            keys, values, weights, lengths, offsets, self._stride,
            None, None, None, None, None, None, None, None, None,
        )
        # fmt: on

    def _with_strides(
        self, per_rank: Tensor | None, stride_per_key: list[int] | None, length_per_key: list[int] | None
    ) -> "KeyedJaggedTensor":
        """Set the VBE strides and per-key caches of a KJT just built by ``_derived``; returns self."""
        self._stride_per_key_per_rank = per_rank
        self._stride_per_key = stride_per_key
        self._length_per_key = length_per_key
        return self

    def _empty_part(self, per_rank: Tensor | None, empty_offsets: bool) -> "KeyedJaggedTensor":
        """No keys, with this KJT's dtypes, device and stride (and, as TorchRec's split, empty offsets)."""
        device, weights = self.device(), self._weights
        empty = self._derived(
            torch.jit.annotate(list[str], []),
            torch.empty(0, device=device, dtype=self._values.dtype),
            None if weights is None else torch.empty(0, device=device, dtype=weights.dtype),
            torch.empty(0, device=device, dtype=torch.int32),
            torch.empty(0, device=device, dtype=torch.int32) if empty_offsets else None,
        )
        return empty._with_strides(per_rank, None, None)

    def to(
        self, device: torch.device, non_blocking: bool = False, dtype: torch.dtype | None = None
    ) -> "KeyedJaggedTensor":
        """A copy on ``device``; ``dtype``, as in TorchRec, converts only the weights."""
        weights = self._weights
        if weights is not None:
            weights = weights.to(
                device=device, dtype=dtype if dtype is not None else weights.dtype, non_blocking=non_blocking
            )
        moved = kjt_layout.moved_tensors(
            [self._values, self._lengths, self._offsets], self._inverse_indices, device, non_blocking
        )
        return self._copy_with(moved[0], weights, moved[1], moved[2], moved[3])

    def pin_memory(self) -> "KeyedJaggedTensor":
        """A copy in pinned host memory (for asynchronous host-to-device copies)."""
        pinned = kjt_layout.pinned_tensors([self._values, self._weights, self._lengths, self._offsets])
        inverse = self._inverse_indices
        inverse_tensor = None if inverse is None else inverse[1].pin_memory()
        copy = self._copy_with(pinned[0], pinned[1], pinned[2], pinned[3], inverse_tensor)
        copy._jt_dict = None
        return copy

    def _copy_with(
        self,
        values: Tensor | None,
        weights: Tensor | None,
        lengths: Tensor | None,
        offsets: Tensor | None,
        inverse_tensor: Tensor | None,
    ) -> "KeyedJaggedTensor":
        """This KJT (keys, strides, caches) over other tensors."""
        assert values is not None
        copy = self._derived(self._keys, values, weights, lengths, offsets)
        copy._stride_per_key_per_rank = (
            self._stride_per_key_per_rank if self.variable_stride_per_key() else None
        )
        copy._stride_per_key, copy._length_per_key = self._stride_per_key, self._length_per_key
        copy._lengths_offset_per_key, copy._offset_per_key = (
            self._lengths_offset_per_key,
            self._offset_per_key,
        )
        copy._index_per_key, copy._jt_dict = self._index_per_key, self._jt_dict
        inverse = self._inverse_indices
        if inverse is not None and inverse_tensor is not None:
            copy._inverse_indices = (inverse[0], inverse_tensor)
        return copy

    # --------------------------------------------------------------------------- distribution (TorchRec's)

    def dist_labels(self) -> list[str]:
        """Names of the tensors ``dist_tensors`` returns."""
        return kjt_dist.labels(self.variable_stride_per_key(), self._weights is not None)

    def dist_splits(self, key_splits: list[int]) -> list[list[int]]:
        """Per tensor of ``dist_tensors``, how many entries go to each group of ``key_splits`` keys."""
        return kjt_dist.splits(
            self.stride_per_key(),
            self.length_per_key(),
            key_splits,
            self.variable_stride_per_key(),
            self._weights is not None,
        )

    def dist_tensors(self) -> list[Tensor]:
        """The tensors an all-to-all of this KJT sends: lengths, values, (VBE) strides, (weighted) weights."""
        strides = self.stride_per_key() if self.variable_stride_per_key() else None
        return kjt_dist.tensors(self.lengths(), self._values, self._weights, strides)

    @staticmethod
    def dist_init(
        keys: list[str],
        tensors: list[Tensor],
        variable_stride_per_key: bool,
        num_workers: int,
        recat: Tensor | None,
        stride_per_rank: list[int] | None,
        stagger: int = 1,
    ) -> "KeyedJaggedTensor":
        """Rebuild a KJT from the tensors an all-to-all received (``recat`` reorders rank-major blocks
        into key-major order). Synced."""
        lengths, values, weights, stride, per_rank = kjt_dist.init(
            keys, tensors, variable_stride_per_key, num_workers, recat, stride_per_rank, stagger
        )
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=stride,
            stride_per_key_per_rank=per_rank,
        ).sync()

    # ------------------------------------------------------------------------------------ device and sync

    def sync(self) -> "KeyedJaggedTensor":
        """Compute and cache length_per_key and offset_per_key now (one host sync); returns self."""
        if not torch.jit.is_scripting() and torch.compiler.is_dynamo_compiling():
            return self  # the sizes would be data-dependent; compute them where used
        self.length_per_key()
        self.offset_per_key()
        return self

    def unsync(self) -> "KeyedJaggedTensor":
        """Drop the cached length_per_key/offset_per_key so that nothing forces a sync; returns self."""
        self._length_per_key = None
        self._offset_per_key = None
        return self

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use on ``stream`` (CUDA caching allocator)."""
        for tensor in (self._values, self._weights, self._lengths, self._offsets):
            if tensor is not None:
                tensor.record_stream(stream)

    @torch.jit.unused
    def clear_storage(self) -> int:
        """Free the storage of values, lengths, offsets and weights (the object stays); returns the bytes
        released."""
        released = 0
        for tensor in (self._values, self._lengths, self._offsets, self._weights):
            if tensor is not None:
                released += tensor.element_size() * tensor.numel()
                tensor.untyped_storage().resize_(0)
        return released

    @torch.jit.unused
    def __str__(self) -> str:
        if self._offsets is None and self._lengths is None:
            return "KeyedJaggedTensor()\n"
        return formatting.keyed_jagged_text(
            self._keys, self._values, self._weights, self.offsets(), self.stride_per_key()
        )

    @torch.jit.unused
    def __repr__(self) -> str:
        return self.__str__()


# The constructors that read other KJTs (behind the static methods above; the parts that need no KJT are in
# kjt_ops). Instance methods build their results themselves: TorchScript compiles a class's instance methods
# with the class, and a function taking the class would recurse into that.


def _kjt_concat(kjt_list: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    weights: list[Tensor | None] = []
    length_per_key: list[list[int] | None] = []
    per_rank: list[Tensor | None] = []
    inverses: list[InverseIndices | None] = []
    for kjt in kjt_list:  # typed lists: TorchScript warns on comprehensions of Optional values
        weights.append(kjt.weights_or_none())
        length_per_key.append(kjt.length_per_key_or_none())
        per_rank.append(kjt._stride_per_key_per_rank)
        inverses.append(kjt.inverse_indices_or_none())
    parts = kjt_ops.concat_parts(
        [kjt.keys() for kjt in kjt_list],
        [kjt.values() for kjt in kjt_list],
        weights,
        [kjt.lengths() for kjt in kjt_list],
        length_per_key,
        [kjt.stride() for kjt in kjt_list],
        [kjt.variable_stride_per_key() for kjt in kjt_list],
        per_rank,
    )
    return KeyedJaggedTensor(
        keys=parts[0],
        values=parts[1],
        weights=parts[2],
        lengths=parts[3],
        stride=parts[4],
        stride_per_key_per_rank=parts[5],
        length_per_key=parts[6],
        inverse_indices=kjt_ops.concat_inverse_indices(inverses),
    )


def _kjt_empty_like_stride(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
    weights = kjt.weights_or_none()
    per_rank = kjt._stride_per_key_per_rank
    variable = per_rank is not None and kjt.variable_stride_per_key()
    return KeyedJaggedTensor(
        keys=torch.jit.annotate(list[str], []),
        values=torch.empty(0, device=kjt.device(), dtype=kjt.values().dtype),
        weights=None if weights is None else torch.empty(0, device=kjt.device(), dtype=weights.dtype),
        lengths=torch.empty(0, device=kjt.device(), dtype=kjt.lengths().dtype),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=per_rank if variable else None,
    )


def _kjt_empty_like_device(kjt: KeyedJaggedTensor, device: torch.device) -> KeyedJaggedTensor:
    per_rank = kjt._stride_per_key_per_rank
    variable = per_rank is not None and kjt.variable_stride_per_key()
    inverse = kjt.inverse_indices_or_none()
    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=torch.empty_like(kjt.values(), device=device),
        weights=kjt_ops.empty_like_or_none(kjt.weights_or_none(), device),
        lengths=kjt_ops.empty_like_or_none(kjt.lengths_or_none(), device),
        offsets=kjt_ops.empty_like_or_none(kjt.offsets_or_none(), device),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=per_rank if variable else None,
        stride_per_key=kjt._stride_per_key,
        length_per_key=kjt._length_per_key,
        offset_per_key=kjt._offset_per_key,
        inverse_indices=None
        if inverse is None
        else (inverse[0], torch.empty_like(inverse[1], device=device)),
    )


# torch.fx records these as leaves (their bodies loop over their inputs).
torch.fx.wrap("_kjt_concat")
torch.fx.wrap("_kjt_empty_like_stride")
torch.fx.wrap("_kjt_empty_like_device")
torch.fx.wrap("_kjt_to_jt_dict")
