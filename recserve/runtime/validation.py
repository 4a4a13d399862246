"""Request checks before a batch reaches the kernels: shapes, dtypes, jagged structure, ids inside tables.

The FBGEMM int-N kernels run without their own bounds check, so whatever reaches them must already be in
range: these checks are what keeps a malformed batch from reading out of bounds, and they always run. Each
length and offset is bounded element-wise (``0 <= x <= number of values``, compared in int64) before any
sum or difference, so no int64 wrap-around (lengths of 2^62 summing to 25) can pass. The kernels are then
fed a KJT rebuilt from the checked offsets only, so a stale or forged cache (``length_per_key``, lengths that
disagree with offsets) cannot steer them. Errors are ``InvalidRequestError`` naming the argument or feature
and the numbers (the server maps them to INVALID_ARGUMENT).
"""

from __future__ import annotations

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from rectrain.sparse import KeyedJaggedTensor

_ID_DTYPES = (torch.int32, torch.int64)
_INT64_MAX = torch.iinfo(torch.int64).max
_MAX_CACHED_ORDERS = 64


class RequestValidator:
    """Checks ``(dense, kjt)`` against the model's dense width and per-feature table sizes.

    Args:
        dense_in_features: expected width of ``dense`` (0: any width, e.g. two-tower models read none).
        num_embeddings: rows of the table each feature reads, in feature order.
    """

    def __init__(self, dense_in_features: int, num_embeddings: dict[str, int]) -> None:
        self.dense_in_features = dense_in_features
        self.num_embeddings = dict(num_embeddings)
        self._limits: dict[tuple[str, ...], Tensor] = {}

    def check(self, dense: Tensor, kjt: KeyedJaggedTensor, *, checked: bool = False) -> int:
        """The batch size, or InvalidRequestError naming what is wrong (see ``safe_batch``)."""
        return self.safe_batch(dense, kjt, checked=checked)[0]

    def safe_batch(
        self, dense: Tensor, kjt: KeyedJaggedTensor, *, checked: bool = False
    ) -> tuple[int, KeyedJaggedTensor]:
        """``(batch size, a KJT the kernels may read)``, or InvalidRequestError naming what is wrong.

        ``checked=True`` (a caller that has checked the batch itself) skips only what cannot make a
        kernel read out of bounds: dense values being finite. Everything memory safety rests on runs
        always, in a few vectorised passes with two host syncs.
        """
        batch = self._check_dense(dense, finite=not checked)
        if not isinstance(kjt, KeyedJaggedTensor):
            raise InvalidRequestError(
                f"sparse features must be a KeyedJaggedTensor, got {type(kjt).__name__}"
            )
        keys = list(kjt.keys())
        self._check_keys(keys)
        if kjt.variable_stride_per_key():
            raise InvalidRequestError("sparse features must have one batch size for every feature")
        lengths, offsets = kjt.lengths_or_none(), kjt.offsets_or_none()
        for name, tensor in (("lengths", lengths), ("offsets", offsets)):
            _check_jagged_type(name, tensor)
        if kjt.stride() != batch:
            raise InvalidRequestError(
                f"dense has {batch} examples but the sparse features have {kjt.stride()}"
            )
        values, weights = kjt.values(), kjt.weights_or_none()
        values = _check_values(values, weights)
        if values.dtype == torch.int32 and values.numel() > torch.iinfo(torch.int32).max:
            values = values.long()  # its offsets would not fit int32, and the kernels want one dtype
        offsets = _checked_offsets(lengths, offsets, len(keys) * batch, values)
        bounds = offsets[::batch] if batch else offsets.new_zeros(len(keys) + 1)
        counts = bounds.diff()
        self._check_ids(keys, values, counts)
        safe = KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            offsets=offsets if values.dtype == torch.int64 else offsets.to(torch.int32),
            stride=batch,
            length_per_key=counts.tolist(),
            validate=False,
        )
        return batch, safe

    def _check_dense(self, dense: Tensor, *, finite: bool) -> int:
        if not isinstance(dense, Tensor) or dense.dim() != 2:
            shape = tuple(dense.shape) if isinstance(dense, Tensor) else type(dense).__name__
            raise InvalidRequestError(
                f"dense must be a 2-D tensor [batch, {self.dense_in_features}], got {shape}"
            )
        if self.dense_in_features and dense.shape[1] != self.dense_in_features:
            raise InvalidRequestError(
                f"dense has {dense.shape[1]} features per example; the model takes {self.dense_in_features}"
            )
        if not dense.is_floating_point():
            raise InvalidRequestError(f"dense must be a float tensor, got {dense.dtype}")
        if finite and dense.numel() and not bool(torch.isfinite(dense).all()):
            row, col = (~torch.isfinite(dense)).nonzero()[0].tolist()
            raise InvalidRequestError(
                f"dense: NaN or inf at example {row}, feature {col} ({dense[row, col].item()})"
            )
        return int(dense.shape[0])

    def _check_keys(self, keys: list[str]) -> None:
        if len(set(keys)) != len(keys):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            raise InvalidRequestError(f"sparse keys: features {twice} appear more than once")
        present = set(keys)
        missing = [name for name in self.num_embeddings if name not in present]
        if missing:
            raise InvalidRequestError(
                f"sparse features miss {missing}; the model reads {list(self.num_embeddings)}, "
                f"the request has {keys}"
            )

    def _key_limits(self, keys: list[str]) -> Tensor:
        """Per key, the number of rows its ids must stay under (int64 max for keys the model ignores)."""
        key = tuple(keys)
        if key not in self._limits:
            if len(self._limits) >= _MAX_CACHED_ORDERS:  # callers choose key orders: keep the cache bounded
                self._limits.clear()
            rows = [self.num_embeddings.get(name, _INT64_MAX) for name in keys]
            self._limits[key] = torch.tensor(rows, dtype=torch.int64)
        return self._limits[key]

    def _check_ids(self, keys: list[str], values: Tensor, counts: Tensor) -> None:
        """One min/max pass over all ids (enough when every id is under the smallest table), else one pass
        against a per-id limit; the per-feature search for the message only on failure."""
        if values.numel() == 0:
            return
        limits = self._key_limits(keys).to(values.device)
        smallest, largest = torch.aminmax(values)
        if int(smallest) >= 0 and int(largest) < int(limits.min()):
            return
        limit = limits.repeat_interleave(counts, output_size=values.numel())
        if not bool(((values < 0) | (values >= limit)).any()):
            return
        ends = counts.cumsum(0).tolist()
        for index, name in enumerate(keys):
            segment = values[ends[index] - int(counts[index]) : ends[index]]
            rows = int(limits[index])
            bad = segment[(segment < 0) | (segment >= rows)]
            if bad.numel():
                raise InvalidRequestError(
                    f"feature {name!r}: id {int(bad[0])} is out of range; ids must lie in [0, {rows})"
                )


def _check_values(values: Tensor, weights: Tensor | None) -> Tensor:
    """``values`` (an empty tensor of any dtype, e.g. ``torch.tensor([])``, as int64), or the error."""
    if not isinstance(values, Tensor) or values.dim() != 1:
        raise InvalidRequestError(f"sparse values must be a 1-D tensor, got {_describe(values)}")
    if values.dtype not in _ID_DTYPES:
        if values.numel() == 0:
            return values.new_empty(0, dtype=torch.int64)
        raise InvalidRequestError(f"sparse feature ids must be int32 or int64, got {values.dtype}")
    if weights is None:
        return values
    if not isinstance(weights, Tensor) or weights.dim() != 1 or not weights.is_floating_point():
        raise InvalidRequestError(f"sparse weights must be a 1-D float tensor, got {_describe(weights)}")
    if weights.numel() != values.numel():
        raise InvalidRequestError(
            f"sparse weights: {weights.numel()} weights for {values.numel()} values (one per value)"
        )
    return values


def _checked_offsets(lengths: Tensor | None, offsets: Tensor | None, rows: int, values: Tensor) -> Tensor:
    """int64 offsets of ``rows`` bags over ``values``, each entry bounded before any arithmetic."""
    n = values.numel()
    for name, tensor, size in (("lengths", lengths, rows), ("offsets", offsets, rows + 1)):
        if tensor is not None and tensor.numel() != size:
            raise InvalidRequestError(
                f"sparse {name}: expected {size} entries (keys x batch{' + 1' * (name == 'offsets')}), "
                f"got {tensor.numel()}"
            )
    if offsets is not None:
        result = offsets.to(torch.int64)
        _raise_outside("offsets", result, n)
        steps = result.diff()  # cannot wrap: every entry lies in [0, n]
        first, last, decreasing = torch.stack([result[0], result[-1], (steps < 0).sum()]).tolist()
        if first != 0 or last != n or decreasing:
            raise InvalidRequestError(
                f"sparse offsets must rise from 0 to the number of values {n}: they start at {first}, "
                f"end at {last} and decrease at {decreasing} positions"
            )
        if lengths is not None and not torch.equal(lengths.to(torch.int64), steps):
            raise InvalidRequestError("sparse lengths and offsets disagree (lengths != diff(offsets))")
        return result
    result = lengths.to(torch.int64)
    _raise_outside("lengths", result, n)
    # Each entry is in [0, n], so the cumulative sum is at most rows * n: no int64 wrap for any real batch.
    result = torch.cat([result.new_zeros(1), result.cumsum(0)])
    if int(result[-1]) != n:
        raise InvalidRequestError(f"sparse lengths sum to {int(result[-1])} but there are {n} values")
    return result


def _check_jagged_type(name: str, tensor: object) -> None:
    """InvalidRequestError unless ``tensor`` is None or a 1-D integer tensor (an empty one of any dtype,
    such as ``torch.tensor([])``, is accepted as no rows)."""
    if tensor is None:
        return
    integer = isinstance(tensor, Tensor) and (tensor.dtype in _ID_DTYPES or tensor.numel() == 0)
    if not integer or tensor.dim() != 1:
        raise InvalidRequestError(
            f"sparse {name} must be a 1-D int32 or int64 tensor, got {_describe(tensor)}"
        )


def _raise_outside(name: str, tensor: Tensor, n: int) -> None:
    """InvalidRequestError unless every entry of ``tensor`` lies in ``[0, n]``."""
    outside = (tensor < 0) | (tensor > n)
    if bool(outside.any()):
        position = int(outside.nonzero()[0])
        raise InvalidRequestError(
            f"sparse {name}[{position}] = {int(tensor[position])} is outside [0, {n}] (the number of values)"
        )


def _describe(tensor: object) -> str:
    if isinstance(tensor, Tensor):
        return f"{tensor.dtype} of shape {tuple(tensor.shape)}"
    return type(tensor).__name__
