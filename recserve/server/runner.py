"""One loaded model version: its predictor, the schema requests are checked against, and its own batcher.

Requests of a batch are merged into one KeyedJaggedTensor (per key, the requests' rows one after another),
scored by one ``predictor.predict`` call, and the scores are split back per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from recserve.errors import NonFiniteScoresError
from recserve.server.arrays import FeatureArrays
from recserve.server.batcher import BatcherConfig, BatchObserver, DynamicBatcher
from recserve.server.stats import ModelStats
from recserve.server.validation import InferenceRequest, ModelSchema, check_request
from rectrain.sparse import KeyedJaggedTensor

logger = logging.getLogger(__name__)


class PredictorLike(Protocol):
    """What the server needs of ``recserve.runtime.Predictor``."""

    @property
    def metadata(self): ...

    def predict(self, dense: Tensor, kjt: KeyedJaggedTensor, *, checked: bool = False) -> Tensor: ...


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


def _feature_dtypes(package_dir: Path | None, table_dtypes: dict[str, str]) -> dict[str, str]:
    """Storage dtype of the table each feature reads, from the package manifest's model config."""
    if package_dir is None:
        return {}
    from recserve.runtime import read_manifest

    tables = read_manifest(package_dir).model_config.get("tables", [])
    return {f: table_dtypes.get(t["name"], "") for t in tables for f in t.get("feature_names", [])}


class ModelRunner:
    """Serves one predictor through its own dynamic batcher."""

    def __init__(
        self,
        predictor: PredictorLike,
        batcher_config: BatcherConfig,
        *,
        observer: BatchObserver | None = None,
        package_dir: Path | None = None,
        on_nonfinite: Callable[[], None] | None = None,
    ) -> None:
        self.predictor = predictor
        self._on_nonfinite = on_nonfinite
        self.package_dir = package_dir
        self.schema = ModelSchema.from_metadata(predictor.metadata, batcher_config.max_batch_size)
        self.feature_dtypes = _feature_dtypes(package_dir, predictor.metadata.table_dtypes)
        self.stats = ModelStats()
        self.batcher: DynamicBatcher[InferenceRequest, Tensor | Exception] = DynamicBatcher(
            self._predict_batch,
            batcher_config,
            observer=observer,
            name=f"batcher-{self.schema.model_name}-{self.schema.version}",
        )

    @property
    def model_id(self) -> tuple[str, str]:
        return self.schema.model_name, self.schema.version

    def submit(self, request: InferenceRequest, deadline: float | None) -> Future:
        """Queues a checked request; the future yields ``Completed`` with the request's ``[B]`` scores."""
        return self.batcher.submit(request, size=request.batch_size, deadline=deadline)

    @torch.inference_mode()
    def _predict_batch(
        self, requests: list[InferenceRequest], *, record: bool = True
    ) -> list[Tensor | Exception]:
        t0 = time.perf_counter()
        dense, kjt = merge_requests(requests)
        t1 = time.perf_counter()
        # Every request was checked on arrival (check_request), so the merged batch is not checked again.
        scores = self.predictor.predict(dense, kjt, checked=True).reshape(-1)
        t2 = time.perf_counter()
        if scores.numel() != dense.shape[0]:
            raise RuntimeError(f"predictor returned {scores.numel()} scores for a batch of {dense.shape[0]}")
        out: list[Tensor | Exception] = list(
            torch.split(scores.to(torch.float32), [r.batch_size for r in requests])
        )
        if not bool(torch.isfinite(scores).all()):
            out = [self._refuse_nonfinite(part) for part in out]
        if record:
            self.stats.batch_done(
                int(dense.shape[0]), len(requests), t1 - t0, t2 - t1, time.perf_counter() - t2
            )
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

    def warmup(self, batch_size: int = 8) -> None:
        """Checks and scores one request of id 0, so that a swapped-in model answers its first request at
        full speed (the request checks' TorchScript compiles here)."""
        s = self.schema
        batch_size = min(batch_size, s.max_batch_size)
        num_keys = len(s.feature_names)
        arrays = FeatureArrays(
            batch_size=batch_size,
            dense=torch.zeros(batch_size * s.dense_in_features),
            keys=list(s.feature_names),
            lengths=torch.ones(num_keys * batch_size, dtype=torch.int32),
            values=torch.zeros(num_keys * batch_size, dtype=torch.int64),
        )
        start = time.monotonic()
        self._predict_batch([check_request(arrays, s)], record=False)
        logger.info("warmed up %s %s in %.1f ms", *self.model_id, (time.monotonic() - start) * 1e3)

    def close(self, timeout: float | None = None) -> None:
        """Finishes the queued requests and stops the batcher."""
        self.batcher.close(timeout)
