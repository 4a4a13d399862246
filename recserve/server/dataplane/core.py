"""The transport-agnostic data plane every API calls: check → batch → predict → this request's scores.

It holds the serving :class:`ModelRunner` and swaps in a new one without failing a request: requests already
queued on the old runner finish there (its batcher drains before it closes), and a request that raced the
swap is retried on the new runner. A model can also be unloaded (Triton's repository extension); requests for
it then get :class:`UnavailableError` until a load brings it back.

Blocking callers use :meth:`InferenceCore.infer`; asynchronous ones (the REST server's event loop) call
:meth:`submit`, await the ticket's future, then :meth:`complete`.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from torch import Tensor

from recserve.errors import DeadlineExceededError, ModelNotFoundError, UnavailableError
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.parts import RequestParts
from recserve.server.dataplane.runner import BatchItem, ModelRunner
from recserve.server.dataplane.validation import ModelSchema, admit_request

logger = logging.getLogger(__name__)

# A batch already running when its deadline passes still completes; wait this much longer before giving up.
_RESULT_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class InferenceResult:
    scores: Tensor  # [B] float32
    model_name: str
    model_version: str  # the version that scored it: "N", or "N.SEQ" after deltas
    queue_seconds: float
    inference_seconds: float
    executed_batch_size: int


@dataclass(frozen=True)
class Ticket:
    """A request queued on ``runner``; ``future`` yields the batcher's ``Completed``."""

    runner: ModelRunner
    future: Future
    received: float  # time.monotonic() at receipt
    deadline: float | None


class InferenceCore:
    """Validates, batches and scores requests on the current model; swaps models on reload."""

    def __init__(self, runner: ModelRunner) -> None:
        self._runner: ModelRunner | None = runner
        self._last_schema = runner.schema  # the model's identity while it is unloaded
        self._swap_lock = threading.Lock()
        self._closed = False

    @property
    def runner(self) -> ModelRunner:
        """The serving runner; :class:`UnavailableError` while the model is unloaded."""
        runner = self._runner
        if runner is None:
            s = self._last_schema
            raise UnavailableError(
                f"model {s.model_name!r} is unloaded (RepositoryModelUnload); "
                "RepositoryModelLoad loads it again"
            )
        return runner

    @property
    def current(self) -> ModelRunner | None:
        """The serving runner, or None while the model is unloaded."""
        return self._runner

    @property
    def model_name(self) -> str:
        """The served model's name (also while it is unloaded)."""
        return self._last_schema.model_name

    @property
    def schema(self) -> ModelSchema:
        return self.runner.schema

    @property
    def ready(self) -> bool:
        return not self._closed

    def find(self, name: str, version: str = "") -> ModelRunner:
        """The runner serving ``name`` (and ``version``; "" means any): :class:`ModelNotFoundError` for a name
        or version the server does not have, :class:`UnavailableError` while the model is unloaded."""
        if name and name != self._last_schema.model_name:
            raise ModelNotFoundError(
                f"model_name: {name!r} is not served here (serving {self._last_schema.model_name!r})"
            )
        runner = self.runner
        # A base version names whatever delta of it serves; the version a reply named ("N.SEQ") is also
        # taken while it still serves.
        if version and version != runner.schema.version and version != runner.version:
            raise ModelNotFoundError(
                f"model_version: {version!r} of {runner.schema.model_name!r} is not served "
                f"(serving version {runner.version!r})"
            )
        return runner

    def submit(
        self,
        arrays: FeatureArrays | RequestParts,
        *,
        deadline: float | None = None,
        model_name: str = "",
        model_version: str = "",
        received: float | None = None,
    ) -> Ticket:
        """Checks ``arrays`` against the model and queues them (parts cut for the serving schema are checked
        with their batch); never blocks on the batch."""
        received = time.monotonic() if received is None else received
        if deadline is not None and deadline <= time.monotonic():
            raise DeadlineExceededError("the request's deadline had passed when it arrived")
        while True:
            runner = self.find(model_name, model_version)
            try:
                request = _checked(arrays, runner.schema)
                future = runner.submit(request, deadline)
            except UnavailableError:
                if runner is self._runner or self._closed:
                    raise
                continue  # the model was swapped between reading it and submitting: use the new one
            except Exception:
                runner.stats.request_done(False, time.monotonic() - received)
                raise
            return Ticket(runner, future, received, deadline)

    def complete(self, ticket: Ticket) -> InferenceResult:
        """The result of a ticket whose future is done (re-raises its error); records the statistics."""
        runner = ticket.runner
        try:
            done = ticket.future.result(0)
        except BaseException:
            runner.stats.request_done(False, time.monotonic() - ticket.received)
            raise
        runner.stats.request_done(True, time.monotonic() - ticket.received, (done.queue_seconds,))
        scored = done.result
        return InferenceResult(
            scored.scores,
            runner.schema.model_name,
            scored.version,
            done.queue_seconds,
            done.inference_seconds,
            done.batch_size,
        )

    def wait_timeout(self, ticket: Ticket) -> float | None:
        """How long to wait for a ticket's result: past its deadline by a grace period (None: no deadline)."""
        if ticket.deadline is None:
            return None
        return max(0.0, ticket.deadline - time.monotonic()) + _RESULT_GRACE_SECONDS

    def expired(self, ticket: Ticket) -> DeadlineExceededError:
        """Counts a ticket whose wait ran out before its batch finished; returns the error to raise."""
        ticket.future.cancel()  # no use computing it if it has not started
        ticket.runner.stats.request_done(False, time.monotonic() - ticket.received)
        return DeadlineExceededError("the request's deadline passed while its batch was computed")

    def infer(
        self,
        arrays: FeatureArrays | RequestParts,
        *,
        deadline: float | None = None,
        model_name: str = "",
        model_version: str = "",
        received: float | None = None,
    ) -> InferenceResult:
        """Scores one request, blocking; ``deadline`` is a ``time.monotonic()`` instant or None."""
        ticket = self.submit(
            arrays, deadline=deadline, model_name=model_name, model_version=model_version, received=received
        )
        try:
            ticket.future.result(self.wait_timeout(ticket))
        except FutureTimeout:
            raise self.expired(ticket) from None
        except BaseException:
            pass  # complete() re-raises it and counts it
        return self.complete(ticket)

    def swap(self, new: ModelRunner) -> ModelRunner | None:
        """Serves ``new`` from now on and returns the previous runner (None if the model was unloaded), still
        draining its queued requests. The caller closes it (``old.close()`` waits for the drain) once it has
        announced the new model."""
        with self._swap_lock:
            old, self._runner = self._runner, new
            self._last_schema = new.schema
        if old is None:
            logger.info("now serving %s %s (was unloaded)", *new.model_id)
        else:
            logger.info("now serving %s %s (was %s %s)", *new.model_id, *old.model_id)
        return old

    def unload(self) -> ModelRunner | None:
        """Stops serving the model; returns its runner (the caller closes it), None if already unloaded."""
        with self._swap_lock:
            old, self._runner = self._runner, None
        if old is not None:
            logger.info("unloaded %s %s", *old.model_id)
        return old

    def close(self, timeout: float | None = None) -> None:
        """Refuses new requests and finishes the queued ones."""
        self._closed = True
        if self._runner is not None:
            self._runner.close(timeout)


def _checked(arrays: FeatureArrays | RequestParts, schema: ModelSchema) -> BatchItem:
    """What the runner of ``schema`` queues: parts cut for it as they are (parts cut for another schema are
    checked now), anything else past the wire rules; the data is checked with the batch."""
    if isinstance(arrays, RequestParts):
        return arrays if arrays.schema is schema else arrays.checked(schema)
    return admit_request(arrays, schema)
