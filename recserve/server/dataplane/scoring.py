"""One batch of requests in, each request's scores (or its error) out: merge, predict, split.

The batch function of the server's batcher (:class:`recserve.server.dataplane.runner.ModelRunner`) and of the
Triton Python backend that ``recserve export --triton-repository`` writes
(:mod:`recserve.export.triton_backend`), so both serve a package with the same checks and the same merge.
Requests are merged (as parts, the usual form, :mod:`recserve.server.dataplane.parts` and
:mod:`recserve.server.dataplane.merge`; else as requests past the wire rules) and the predictor checks the
whole batch; when a check refuses, each request is checked alone and only those at fault fail. Scores that
come out NaN or infinite refuse their request; the others of the batch get theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError, NonFiniteScoresError
from recserve.server.dataplane.merge import MergeRefused, check_each, merge_parts
from recserve.server.dataplane.parts import RequestParts
from recserve.server.dataplane.validation import InferenceRequest, ModelSchema
from rectrain.sparse import KeyedJaggedTensor

BatchItem = InferenceRequest | RequestParts  # what a batch is made of


class PredictorLike(Protocol):
    """What serving needs of ``recserve.runtime.Predictor``."""

    @property
    def metadata(self): ...

    def predict(self, dense: Tensor, kjt: KeyedJaggedTensor, *, checked: bool = False) -> Tensor: ...


@dataclass(frozen=True)
class BatchTimes:
    """Where a computed batch's time went (seconds), as Triton's statistics split it."""

    examples: int
    merge_s: float
    predict_s: float
    split_s: float


def merge_requests(requests: list[InferenceRequest]) -> tuple[Tensor, KeyedJaggedTensor]:
    """One batch from requests that share their keys: dense rows stacked, every key's rows concatenated."""
    if len(requests) == 1:
        return requests[0].dense, requests[0].kjt
    kjts = [r.kjt for r in requests]
    keys = kjts[0].keys()
    num_keys = len(keys)
    dense = torch.cat([r.dense for r in requests])
    lengths = torch.cat([k.lengths().view(num_keys, -1) for k in kjts], dim=1).reshape(-1)
    per_key = [k.length_per_key() for k in kjts]
    value_parts = [torch.split(k.values(), p) for k, p in zip(kjts, per_key)]
    values = torch.cat([parts[f] for f in range(num_keys) for parts in value_parts])
    weights = None
    if any(k.weights_or_none() is not None for k in kjts):
        weight_parts = [
            torch.split(_weights_or_ones(k), p) for k, p in zip(kjts, per_key)
        ]  # an unweighted request in a weighted batch counts each id once
        weights = torch.cat([parts[f] for f in range(num_keys) for parts in weight_parts])
    merged = KeyedJaggedTensor(
        keys=keys,
        values=values,
        weights=weights,
        lengths=lengths,
        stride=int(dense.shape[0]),
        length_per_key=[sum(p[f] for p in per_key) for f in range(num_keys)],
        validate=False,
    )
    return dense, merged


def _weights_or_ones(kjt: KeyedJaggedTensor) -> Tensor:
    w = kjt.weights_or_none()
    return torch.ones(kjt.values().numel(), dtype=torch.float32) if w is None else w


class BatchScorer:
    """``scorer(items) -> (per item its [b] float32 scores or its error, BatchTimes or None)``; the times
    are None when no item reached the model (every one refused)."""

    def __init__(
        self,
        predictor: PredictorLike,
        schema: ModelSchema,
        on_nonfinite: Callable[[], None] | None = None,
    ) -> None:
        self.predictor, self.schema, self._on_nonfinite = predictor, schema, on_nonfinite

    @torch.inference_mode()
    def __call__(self, items: list[BatchItem]) -> tuple[list[Tensor | Exception], BatchTimes | None]:
        t0 = time.perf_counter()
        checked: list[InferenceRequest | Exception] | None = None
        try:
            dense, kjt = self._merged(items)
            t1 = time.perf_counter()
            # The predictor checks the merged batch's data (finiteness too): each check once per batch.
            scores = self.predictor.predict(dense, kjt).reshape(-1)
        except (MergeRefused, InvalidRequestError):  # some request is at fault: each is checked alone
            checked = check_each(items)
            good = [c for c in checked if isinstance(c, InferenceRequest)]
            if not good:
                return list(checked), None  # type: ignore[arg-type]  # every one an error
            dense, kjt = merge_requests(good)
            t1 = time.perf_counter()
            # Every request was checked alone; the predictor checks only what memory safety rests on.
            scores = self.predictor.predict(dense, kjt, checked=True).reshape(-1)
        t2 = time.perf_counter()
        if scores.numel() != dense.shape[0]:
            raise RuntimeError(f"predictor returned {scores.numel()} scores for a batch of {dense.shape[0]}")
        out = self._split(scores, items, checked)
        return out, BatchTimes(int(dense.shape[0]), t1 - t0, t2 - t1, time.perf_counter() - t2)

    def _merged(self, items: list[BatchItem]) -> tuple[Tensor, KeyedJaggedTensor]:
        """One batch of ``items`` (all parts, or all requests), dense within the package's bounds."""
        if all(isinstance(i, RequestParts) for i in items):
            dense, kjt = merge_parts(items, self.schema)  # type: ignore[arg-type]
        elif all(isinstance(i, InferenceRequest) for i in items):
            dense, kjt = merge_requests(items)  # type: ignore[arg-type]
        else:
            raise MergeRefused("parts and requests")  # rare (a reload's race): checked one by one
        if self.schema.dense_bounds is not None:
            dense = self.schema.dense_bounds.apply(dense)
        return dense, kjt

    def _split(
        self, scores: Tensor, items: list[BatchItem], checked: list[InferenceRequest | Exception] | None
    ) -> list[Tensor | Exception]:
        """Each item's scores (in order), or the error it got; non-finite scores refuse their request."""
        if checked is None:
            sizes = [i.batch_size for i in items]
        else:
            sizes = [c.batch_size for c in checked if isinstance(c, InferenceRequest)]
        parts = iter(torch.split(scores.to(torch.float32), sizes))
        if checked is None:
            out: list[Tensor | Exception] = list(parts)
        else:
            out = [next(parts) if isinstance(c, InferenceRequest) else c for c in checked]
        if not bool(torch.isfinite(scores).all()):
            out = [x if isinstance(x, Exception) else self._refuse_nonfinite(x) for x in out]
        return out

    def _refuse_nonfinite(self, scores: Tensor) -> Tensor | Exception:
        """``scores``, or the error its request gets when any of them is NaN or infinite."""
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        if not bad:
            return scores
        if self._on_nonfinite is not None:
            self._on_nonfinite()
        shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
        return NonFiniteScoresError(
            f"scores of example(s) [{shown}] are not finite (NaN or infinite): their inputs (dense values "
            "far outside the training data's range?) drive the model beyond float32"
        )
