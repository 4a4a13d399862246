"""The transport-agnostic data plane both gRPC APIs call: check → batch → predict → this request's scores.

It holds the serving :class:`ModelRunner` and swaps in a new one without failing a request: requests already
queued on the old runner finish there (its batcher drains before it closes), and a request that raced the
swap is retried on the new runner.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from torch import Tensor

from recserve.errors import DeadlineExceededError, InvalidRequestError, UnavailableError
from recserve.server.arrays import FeatureArrays
from recserve.server.runner import ModelRunner
from recserve.server.validation import ModelSchema, check_request

logger = logging.getLogger(__name__)

# A batch already running when its deadline passes still completes; wait this much longer before giving up.
_RESULT_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class InferenceResult:
    scores: Tensor  # [B] float32
    model_name: str
    model_version: str
    queue_seconds: float
    inference_seconds: float
    executed_batch_size: int


class InferenceCore:
    """Validates, batches and scores requests on the current model; swaps models on reload."""

    def __init__(self, runner: ModelRunner) -> None:
        self._runner = runner
        self._swap_lock = threading.Lock()
        self._closed = False

    @property
    def runner(self) -> ModelRunner:
        return self._runner

    @property
    def schema(self) -> ModelSchema:
        return self._runner.schema

    @property
    def ready(self) -> bool:
        return not self._closed

    def infer(
        self, arrays: FeatureArrays, *, deadline: float | None = None, model_name: str = ""
    ) -> InferenceResult:
        """Scores one request; ``deadline`` is a ``time.monotonic()`` instant (None: no deadline)."""
        if deadline is not None and deadline <= time.monotonic():
            raise DeadlineExceededError("the request's deadline had passed when it arrived")
        while True:
            runner = self._runner
            if model_name and model_name != runner.schema.model_name:
                raise InvalidRequestError(
                    f"model_name: {model_name!r} is not served here (serving {runner.schema.model_name!r})"
                )
            request = check_request(arrays, runner.schema)
            try:
                future = runner.submit(request, deadline)
            except UnavailableError:
                if runner is self._runner or self._closed:
                    raise
                continue  # the model was swapped between reading it and submitting: use the new one
            break
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic()) + _RESULT_GRACE_SECONDS
        try:
            done = future.result(timeout)
        except FutureTimeout:
            raise DeadlineExceededError(
                "the request's deadline passed while its batch was computed"
            ) from None
        return InferenceResult(
            done.result, *runner.model_id, done.queue_seconds, done.inference_seconds, done.batch_size
        )

    def swap(self, new: ModelRunner) -> ModelRunner:
        """Serves ``new`` from now on and returns the previous runner, still draining its queued requests.

        The caller closes it (``old.close()`` waits for the drain) once it has announced the new model.
        """
        with self._swap_lock:
            old, self._runner = self._runner, new
        logger.info("now serving %s %s (was %s %s)", *new.model_id, *old.model_id)
        return old

    def close(self, timeout: float | None = None) -> None:
        """Refuses new requests and finishes the queued ones."""
        self._closed = True
        self._runner.close(timeout)
