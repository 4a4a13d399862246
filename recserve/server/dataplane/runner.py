"""One loaded model version: its predictor, the schema requests are checked against, and its own batcher.

A batch is scored by :class:`recserve.server.dataplane.scoring.BatchScorer`: merged into one KeyedJaggedTensor
(per key, the requests' rows one after another), scored by one ``predictor.predict`` call, split back per
request.

A runner that follows training (``recserve serve --follow``) changes its predictor between batches: a delta
is applied under the same turn the batch function holds (:meth:`ModelRunner.between_batches`), so every batch
is scored by exactly one version, and each reply carries the version that scored it (:class:`Scored`). The
batch thread itself runs the change at the start of its next batch: the thread that prepared it runs at a low
priority, and a batch waiting on a turn it held could wait for it to be scheduled again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.batcher import BatcherConfig, BatchObserver, DynamicBatcher
from recserve.server.dataplane.parts import OipLayout
from recserve.server.dataplane.scoring import BatchItem, BatchScorer, PredictorLike, merge_requests
from recserve.server.dataplane.stats import ModelStats
from recserve.server.dataplane.validation import ModelSchema, check_request

__all__ = ["BatchItem", "ModelRunner", "PredictorLike", "Scored", "merge_requests"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long a change waits for the batch path to run it before the caller runs it itself (the runner is idle).
_HANDOVER_S = 0.05


class Scored(NamedTuple):
    """A request's ``[B]`` scores and the model version (``"N"``, or ``"N.SEQ"`` after deltas) that scored
    them: read in the batch's turn, so a delta applied meanwhile cannot make the reply name another."""

    scores: Tensor
    version: str


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
        self.package_dir = package_dir
        self.schema = ModelSchema.from_metadata(predictor.metadata, batcher_config.max_batch_size)
        self.scorer = BatchScorer(predictor, self.schema, on_nonfinite)
        self.feature_dtypes = _feature_dtypes(package_dir, predictor.metadata.table_dtypes)
        self.stats = ModelStats()
        self.oip_layout = OipLayout(self.schema)  # where the usual OIP request's inputs go (parts.py)
        # Held by each batch and by each change of the predictor between batches (a delta); uncontended
        # but for those changes, since the batcher runs one batch at a time.
        self._turn = threading.Lock()
        # Changes handed to the batch path (``between_batches``), run under the turn before the next batch.
        self._changes: list[tuple[Callable[[], object], Future]] = []
        self._changes_lock = threading.Lock()
        self.batcher: DynamicBatcher[BatchItem, Scored | Exception] = DynamicBatcher(
            self._run_batch,
            batcher_config,
            observer=observer,
            name=f"batcher-{self.schema.model_name}-{self.schema.version}",
        )

    @property
    def model_id(self) -> tuple[str, str]:
        return self.schema.model_name, self.schema.version

    def submit(self, request: BatchItem, deadline: float | None) -> Future:
        """Queues a checked request, or parts cut for this schema (checked with their batch); the future
        yields ``Completed`` with the request's :class:`Scored`, or the error the request gets."""
        return self.batcher.submit(request, size=request.batch_size, deadline=deadline)

    @property
    def version(self) -> str:
        """The version serving now: the predictor's ``model_version`` (``"N.SEQ"`` once deltas applied), or
        the package's version for a predictor without deltas."""
        return getattr(self.predictor, "model_version", self.schema.version)

    @property
    def step(self) -> int | None:
        """The training step of the version serving (None: the package does not say)."""
        return getattr(self.predictor, "model_step", None)

    @property
    def wall_time(self) -> float | None:
        """When the trainer read the rows of the version serving (unix seconds; None: unknown)."""
        return getattr(self.predictor, "wall_time", None)

    def between_batches(self, change: Callable[[], T]) -> T:
        """Runs ``change`` (e.g. ``predictor.apply_delta``) while no batch is scored; the next one sees it.
        Its result, or its exception raised here.

        The batch thread runs it, under its turn, before its next batch: a caller of low priority (the
        follower) never holds the turn a batch waits for. Only when no batch comes within ``_HANDOVER_S``
        (an idle runner) does the caller take the turn and run it itself."""
        done: Future = Future()
        with self._changes_lock:
            self._changes.append((change, done))
        try:
            return done.result(timeout=_HANDOVER_S)
        except FutureTimeout:
            pass
        with self._turn:
            self._run_changes()  # none left when a batch ran it meanwhile
        return done.result()

    def _run_changes(self) -> None:
        """The changes handed over so far, in order (the caller holds the turn)."""
        with self._changes_lock:
            changes, self._changes = self._changes, []
        for change, done in changes:
            try:
                done.set_result(change())
            except BaseException as error:  # noqa: BLE001 - raised to the caller of between_batches
                done.set_exception(error)

    def _run_batch(self, items: list[BatchItem]) -> list[Scored | Exception]:
        with self._turn:
            if self._changes:  # read without the lock: one handed over just now waits for the next batch
                self._run_changes()
            version = self.version
            out = self._predict_batch(items)
        return [x if isinstance(x, Exception) else Scored(x, version) for x in out]

    def _predict_batch(self, items: list[BatchItem], *, record: bool = True) -> list[Tensor | Exception]:
        out, times = self.scorer(items)
        if record and times is not None:
            self.stats.batch_done(times.examples, len(items), times.merge_s, times.predict_s, times.split_s)
        return out

    def warmup(self, batch_size: int = 8) -> None:
        """Checks and scores one request of id 0, so that a swapped-in model answers its first request at
        full speed."""
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
        with self._turn:
            self._predict_batch([check_request(arrays, s)], record=False)
        logger.info("warmed up %s %s in %.1f ms", *self.model_id, (time.monotonic() - start) * 1e3)

    def close(self, timeout: float | None = None) -> None:
        """Finishes the queued requests and stops the batcher."""
        self.batcher.close(timeout)
