"""Request checks before a batch reaches the kernels: shapes, features present, ids inside their tables.

Errors are ``InvalidRequestError`` naming the argument or feature and the numbers (the server maps them to
INVALID_ARGUMENT). Checking ids here lets the FBGEMM kernels skip their own bounds check.
"""

from __future__ import annotations

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from rectrain.sparse import KeyedJaggedTensor


class RequestValidator:
    """Checks ``(dense, kjt)`` against the model's dense width and per-feature table sizes.

    Args:
        dense_in_features: expected width of ``dense`` (0: any width, e.g. two-tower models read none).
        num_embeddings: rows of the table each feature reads, in feature order.
    """

    def __init__(self, dense_in_features: int, num_embeddings: dict[str, int]) -> None:
        self.dense_in_features = dense_in_features
        self.num_embeddings = dict(num_embeddings)

    def check(self, dense: Tensor, kjt: KeyedJaggedTensor) -> int:
        """The batch size, or InvalidRequestError naming what is wrong."""
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
        if not isinstance(kjt, KeyedJaggedTensor):
            raise InvalidRequestError(
                f"sparse features must be a KeyedJaggedTensor, got {type(kjt).__name__}"
            )
        keys = set(kjt.keys())
        missing = [name for name in self.num_embeddings if name not in keys]
        if missing:
            raise InvalidRequestError(
                f"sparse features miss {missing}; the model reads {list(self.num_embeddings)}, "
                f"the request has {kjt.keys()}"
            )
        if kjt.variable_stride_per_key():
            raise InvalidRequestError("sparse features must have one batch size for every feature")
        batch = dense.shape[0]
        if kjt.stride() != batch:
            raise InvalidRequestError(
                f"dense has {batch} examples but the sparse features have {kjt.stride()}"
            )
        self._check_ids(kjt)
        return batch

    def _check_ids(self, kjt: KeyedJaggedTensor) -> None:
        """One min/max reduction per feature the model reads (cheaper than a per-id limit tensor)."""
        values = kjt.values()
        if values.numel() == 0:
            return
        if values.is_floating_point():
            raise InvalidRequestError(f"sparse feature ids must be integers, got {values.dtype}")
        ends = torch.tensor(kjt.length_per_key()).cumsum(0).tolist()
        spans = [
            (name, ends[index] - count, ends[index])
            for index, (name, count) in enumerate(zip(kjt.keys(), kjt.length_per_key()))
            if name in self.num_embeddings and count
        ]
        if not spans:
            return
        extremes = torch.stack([torch.stack(torch.aminmax(values[lo:hi])) for _, lo, hi in spans]).tolist()
        for (name, _, _), (smallest, largest) in zip(spans, extremes):
            if smallest < 0 or largest >= self.num_embeddings[name]:
                bad = smallest if smallest < 0 else largest
                raise InvalidRequestError(
                    f"feature {name!r}: id {bad} is out of range; ids must lie in "
                    f"[0, {self.num_embeddings[name]})"
                )
