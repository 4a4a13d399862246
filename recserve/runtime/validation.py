"""Request checks before a batch reaches the kernels: shapes, dtypes, jagged structure, ids inside tables.

The FBGEMM int-N kernels run without their own bounds check, so whatever reaches them must already be in
range: these checks are what keeps a malformed batch from reading out of bounds, and they always run. Each
length and offset is bounded element-wise (``0 <= x <= number of values``, compared in int64) before any
sum or difference, so no int64 wrap-around (lengths of 2^62 summing to 25) can pass. The kernels are then
fed a KJT rebuilt from the checked offsets only, so a stale or forged cache (``length_per_key``, lengths that
disagree with offsets) cannot steer them. Errors are ``InvalidRequestError`` naming the field, the feature
and the numbers; the server passes its wire's :class:`RequestFields`, so that its clients read the names of
the fields they sent (it maps the errors to INVALID_ARGUMENT). These are the only checks of a request's data:
the server adds only the rules of its wire (``recserve.server.dataplane.validation``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from rectrain.sparse import KeyedJaggedTensor

_ID_DTYPES = (torch.int32, torch.int64)
_INT64_MAX = torch.iinfo(torch.int64).max
_MAX_CACHED_ORDERS = 64


@dataclass(frozen=True)
class RequestFields:
    """How errors name a request's fields (``{f}``: the feature): the Python API's names by default."""

    dense: str = "dense"
    keys: str = "sparse keys"
    lengths: str = "sparse lengths"
    offsets: str = "sparse offsets"
    values: str = "sparse values"
    weights: str = "sparse weights"

    def of(self, field: str, feature: str = "") -> str:
        return getattr(self, field).replace("{f}", feature)


PYTHON_FIELDS = RequestFields()


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

    def safe_batch(
        self,
        dense: Tensor,
        kjt: KeyedJaggedTensor,
        *,
        checked: bool = False,
        fields: RequestFields = PYTHON_FIELDS,
        sent: list[int] | None = None,
    ) -> tuple[int, KeyedJaggedTensor]:
        """``(batch size, a KJT the kernels may read)``, or InvalidRequestError naming what is wrong.

        ``checked=True`` (a caller that has checked the batch itself) skips only what cannot make a
        kernel read out of bounds: dense values and weights being finite. Everything memory safety rests on
        runs always, in a few vectorised passes with two host syncs. ``fields`` names the fields in errors;
        ``sent``, the number of ids the request sent per key (a wire that sends them apart), is compared with
        what the lengths say.
        """
        batch = self._check_dense(dense, fields, finite=not checked)
        if not isinstance(kjt, KeyedJaggedTensor):
            raise InvalidRequestError(
                f"sparse features must be a KeyedJaggedTensor, got {type(kjt).__name__}"
            )
        keys = list(kjt.keys())
        self.check_keys(keys, fields)
        if kjt.variable_stride_per_key():
            raise InvalidRequestError("sparse features must have one batch size for every feature")
        lengths, offsets = kjt.lengths_or_none(), kjt.offsets_or_none()
        for name, tensor in (("lengths", lengths), ("offsets", offsets)):
            _check_jagged_type(fields.of(name), tensor)
        if kjt.stride() != batch:
            raise InvalidRequestError(
                f"dense has {batch} examples but the sparse features have {kjt.stride()}"
            )
        values, weights = kjt.values(), kjt.weights_or_none()
        values = _check_values(values, weights, fields)
        if values.dtype == torch.int32 and values.numel() > torch.iinfo(torch.int32).max:
            values = values.long()  # its offsets would not fit int32, and the kernels want one dtype
        jagged = _Jagged(keys, batch, values.numel(), fields)
        offsets = jagged.offsets(lengths, offsets, sent)
        counts = (offsets[::batch] if batch else offsets.new_zeros(len(keys) + 1)).diff()
        self._check_ids(keys, values, counts, fields)
        if weights is not None and not checked:
            _check_finite_weights(weights, keys, counts, fields)
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

    def _check_dense(self, dense: Tensor, fields: RequestFields, *, finite: bool) -> int:
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
                f"{fields.dense}: NaN or inf at example {row}, feature {col} ({dense[row, col].item()})"
            )
        return int(dense.shape[0])

    def check_keys(self, keys: list[str], fields: RequestFields = PYTHON_FIELDS) -> None:
        """InvalidRequestError naming a key given twice or a feature of the model missing."""
        if len(set(keys)) != len(keys):
            twice = next(k for i, k in enumerate(keys) if k in keys[:i])
            raise InvalidRequestError(f"{fields.keys}: feature {twice!r} appears twice")
        present = set(keys)
        missing = [name for name in self.num_embeddings if name not in present]
        if missing:
            raise InvalidRequestError(
                f"{fields.keys}: missing feature {', '.join(map(repr, missing))} (the model reads "
                f"{list(self.num_embeddings)}, the request has {keys})"
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

    def _check_ids(self, keys: list[str], values: Tensor, counts: Tensor, fields: RequestFields) -> None:
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
                    f"{fields.of('values', name)}: feature {name!r} has id {int(bad[0])} outside its "
                    f"table's range [0, {rows})"
                )


def _check_values(values: Tensor, weights: Tensor | None, fields: RequestFields) -> Tensor:
    """``values`` (an empty tensor of any dtype, e.g. ``torch.tensor([])``, as int64), or the error."""
    if not isinstance(values, Tensor) or values.dim() != 1:
        raise InvalidRequestError(f"{fields.values} must be a 1-D tensor, got {_describe(values)}")
    if values.dtype not in _ID_DTYPES:
        if values.numel() == 0:
            return values.new_empty(0, dtype=torch.int64)
        raise InvalidRequestError(f"{fields.values}: ids must be int32 or int64, got {values.dtype}")
    if weights is None:
        return values
    if not isinstance(weights, Tensor) or weights.dim() != 1 or not weights.is_floating_point():
        raise InvalidRequestError(f"{fields.weights} must be a 1-D float tensor, got {_describe(weights)}")
    if weights.numel() != values.numel():
        raise InvalidRequestError(
            f"{fields.weights}: {weights.numel()} weights for {values.numel()} values "
            "(one per value, or none)"
        )
    return values


def _check_finite_weights(weights: Tensor, keys: list[str], counts: Tensor, fields: RequestFields) -> None:
    finite = torch.isfinite(weights)
    if not bool(finite.all()):
        pos = int((~finite).nonzero()[0])
        feature = keys[int(torch.searchsorted(counts.cumsum(0), pos, right=True))]
        raise InvalidRequestError(
            f"{fields.of('weights', feature)}: NaN or inf at value {pos} ({weights[pos].item()})"
        )


@dataclass(frozen=True)
class _Jagged:
    """The jagged structure of ``len(keys) * batch`` bags over ``n`` values, for checking and naming."""

    keys: list[str]
    batch: int
    n: int
    fields: RequestFields

    def offsets(self, lengths: Tensor | None, offsets: Tensor | None, sent: list[int] | None) -> Tensor:
        """int64 offsets, each entry bounded before any arithmetic; per key as many ids as ``sent``."""
        rows, n = len(self.keys) * self.batch, self.n
        for name, tensor, size in (("lengths", lengths, rows), ("offsets", offsets, rows + 1)):
            if tensor is not None and tensor.numel() != size:
                raise InvalidRequestError(
                    f"{self.fields.of(name)}: expected {len(self.keys)} keys x {self.batch} examples"
                    f"{' + 1' * (name == 'offsets')} = {size} entries, got {tensor.numel()}"
                )
        if offsets is not None:
            result = offsets.to(torch.int64)
            self._outside("offsets", result)
            steps = result.diff()  # cannot wrap: every entry lies in [0, n]
            first, last, decreasing = torch.stack([result[0], result[-1], (steps < 0).sum()]).tolist()
            if first != 0 or last != n or decreasing:
                raise InvalidRequestError(
                    f"{self.fields.offsets} must rise from 0 to the number of values {n}: they start at "
                    f"{first}, end at {last} and decrease at {decreasing} positions"
                )
            if lengths is not None and not torch.equal(lengths.to(torch.int64), steps):
                raise InvalidRequestError(
                    f"{self.fields.lengths} and offsets disagree (lengths != diff(offsets))"
                )
        else:
            result = lengths.to(torch.int64)
            self._outside("lengths", result)
            # Each entry is in [0, n], so the cumulative sum is at most rows * n: no int64 wrap.
            result = torch.cat([result.new_zeros(1), result.cumsum(0)])
        if sent is not None:
            self._per_key(result, sent)
        if int(result[-1]) != n:
            raise InvalidRequestError(
                f"{self.fields.values}: lengths sum to {int(result[-1])} but {n} values were sent"
            )
        return result

    def _outside(self, name: str, tensor: Tensor) -> None:
        """InvalidRequestError naming the first entry outside ``[0, n]``, its feature and example."""
        outside = (tensor < 0) | (tensor > self.n)
        if not bool(outside.any()):
            return
        pos = int(outside.nonzero()[0])
        bad, rows = int(tensor[pos]), len(self.keys) * self.batch
        if name == "offsets":
            raise InvalidRequestError(
                f"{self.fields.offsets}: offset {bad} at position {pos} is outside [0, {self.n}] "
                "(the number of values)"
            )
        feature = self.keys[pos // self.batch] if pos < rows else "?"
        where = f"{self.fields.of('lengths', feature)}: "
        at = f"(feature {feature!r}, example {pos % self.batch})"
        if bad < 0:
            raise InvalidRequestError(f"{where}negative length {bad} {at}")
        raise InvalidRequestError(f"{where}length {bad} {at} is more than the {self.n} values sent")

    def _per_key(self, offsets: Tensor, sent: list[int]) -> None:
        bounds = offsets[:: self.batch] if self.batch else offsets.new_zeros(len(self.keys) + 1)
        for key, got, want in zip(self.keys, bounds.diff().tolist(), sent):
            if got != want:
                raise InvalidRequestError(
                    f"{self.fields.of('values', key)}: {want} values, but "
                    f"{self.fields.of('lengths', key)} sum to {got}"
                )


def _check_jagged_type(name: str, tensor: object) -> None:
    """InvalidRequestError unless ``tensor`` is None or a 1-D integer tensor (an empty one of any dtype,
    such as ``torch.tensor([])``, is accepted as no rows)."""
    if tensor is None:
        return
    integer = isinstance(tensor, Tensor) and (tensor.dtype in _ID_DTYPES or tensor.numel() == 0)
    if not integer or tensor.dim() != 1:
        raise InvalidRequestError(f"{name} must be a 1-D int32 or int64 tensor, got {_describe(tensor)}")


def _describe(tensor: object) -> str:
    if isinstance(tensor, Tensor):
        return f"{tensor.dtype} of shape {tuple(tensor.shape)}"
    return type(tensor).__name__
