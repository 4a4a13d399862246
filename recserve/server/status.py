"""The one place that maps recserve's exceptions to gRPC status codes, admits RPCs, and counts every outcome.

Servicers raise; :class:`StatusInterceptor` catches, aborts the RPC with the mapped code and the exception's
message, and records ``recserve_requests_total{method,code}`` and ``recserve_request_latency_seconds`` once
per RPC, whatever its end:

- handled: the code of the reply (OK or the mapped error); a reply the client no longer waits for (it
  cancelled, or its deadline passed while the handler ran) counts as CANCELLED or DEADLINE_EXCEEDED;
- refused by admission control (:mod:`recserve.server.admission`), or by gRPC's own
  ``maximum_concurrent_rpcs`` ("Concurrent RPC limit exceeded!"): RESOURCE_EXHAUSTED;
- ended before a handler thread picked it up (the client cancelled or its deadline passed first, or gRPC
  dropped the message, e.g. one over ``--max-message-mb``): CANCELLED;
- addressed to a method the server does not have: UNIMPLEMENTED with ``method="unknown"`` (the name is the
  client's choice, so it never becomes a label).

gRPC calls no handler in the last three cases, so the interceptor notices through a finalizer on the handler
it returned, which gRPC drops once done with it. gRPC calls ``intercept_service`` on its polling thread as an
RPC arrives and, when it refuses the RPC for its concurrency limit, drops the handler right there, on that
thread; a handler dropped on any other thread belonged to an RPC that ended while waiting for a pool thread.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent import futures

import grpc

from recserve.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PackageError,
    PermissionDeniedError,
    RecServeError,
    UnauthenticatedError,
    UnavailableError,
)
from recserve.server.admission import AdmissionLimit, QueueLag, answer_probe
from recserve.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)

_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (PackageError, grpc.StatusCode.FAILED_PRECONDITION),
    (RecServeError, grpc.StatusCode.INTERNAL),
)
# Probes must answer under overload: these methods are never refused (spare handler threads serve them).
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
UNKNOWN_METHOD = "unknown"


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC code for an exception a handler raised (INTERNAL for anything unexpected)."""
    for exc_type, code in _CODES:
        if isinstance(exc, exc_type):
            return code
    return grpc.StatusCode.INTERNAL


class _Outcome:
    """One RPC's record: counted exactly once, by whichever of handler or finalizer gets there first.

    No lock: the finalizer runs only once gRPC holds no reference to the handler, i.e. after it returned.
    """

    __slots__ = ("method", "start", "release", "done", "arrival_thread", "_metrics")

    def __init__(self, metrics: ServerMetrics, method: str, release: Callable[[], None] | None) -> None:
        self._metrics = metrics
        self.method = method
        self.start = time.perf_counter()
        self.release = release
        self.done = False
        self.arrival_thread = threading.get_ident()

    def finish(self, code: grpc.StatusCode) -> None:
        if self.done:
            return
        self.done = True
        if self.release is not None:
            self.release()
        self._metrics.requests.labels(self.method, code.name).inc()
        self._metrics.request_latency.labels(self.method).observe(time.perf_counter() - self.start)


def _never_ran(outcome: _Outcome) -> None:
    refused_by_grpc = threading.get_ident() == outcome.arrival_thread
    outcome.finish(grpc.StatusCode.RESOURCE_EXHAUSTED if refused_by_grpc else grpc.StatusCode.CANCELLED)


def _gone_code(context: grpc.ServicerContext) -> grpc.StatusCode:
    """Why a client stopped waiting: its deadline passed, or it cancelled."""
    remaining = context.time_remaining()
    return (
        grpc.StatusCode.DEADLINE_EXCEEDED
        if remaining is not None and remaining <= 0
        else grpc.StatusCode.CANCELLED
    )


class StatusInterceptor(grpc.ServerInterceptor):
    """Wraps every unary-unary handler: admission, exception → status code, count, latency and in-flight.

    ``admission`` None admits everything (the admin server); ``shed_pool`` runs the refusals.
    """

    def __init__(
        self,
        metrics: ServerMetrics,
        *,
        admission: AdmissionLimit | None = None,
        lag: QueueLag | None = None,
        shed_pool: futures.ThreadPoolExecutor | None = None,
    ) -> None:
        self._metrics = metrics
        self._admission = admission
        self._lag = lag
        self._shed_pool = shed_pool
        self._probe_handler = grpc.unary_unary_rpc_method_handler(self._on_shed_pool(answer_probe))

    def intercept_service(self, continuation, handler_call_details):
        # Runs on gRPC's polling thread as the RPC arrives, before it waits for a handler thread.
        handler = continuation(handler_call_details)
        if handler is None:
            self._metrics.requests.labels(UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED.name).inc()
            return None
        if handler.unary_unary is None:
            return handler
        full_name = handler_call_details.method
        lag, admission = self._lag, self._admission
        if lag is not None and lag.is_probe(full_name, handler_call_details.invocation_metadata):
            return self._probe_handler  # not counted: the server's own measurement
        refusal = None
        if admission is None or full_name.startswith(EXEMPT_PREFIXES):
            outcome = _Outcome(self._metrics, full_name.lstrip("/"), None)
        elif lag is not None and lag.overloaded():
            refusal = (
                f"server overloaded: new requests wait {lag.lag_s() * 1e3:.0f} ms before a handler sees them "
                f"(over {lag.target_s * 1e3:.0f} ms, --max-queue-lag-ms); retry with backoff"
            )
        elif not admission.try_acquire():
            limit = admission.limit
            refusal = f"server overloaded: {limit} requests in flight (--max-inflight); retry with backoff"
        else:
            outcome = _Outcome(self._metrics, full_name.lstrip("/"), admission.release)
        if refusal is not None:
            outcome = _Outcome(self._metrics, full_name.lstrip("/"), None)
            refuse = self._shed(outcome, refusal)
            weakref.finalize(refuse, _never_ran, outcome)
            return grpc.unary_unary_rpc_method_handler(refuse)  # the request stays bytes: never parsed
        behavior = self._serve(handler.unary_unary, outcome)
        weakref.finalize(behavior, _never_ran, outcome)
        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _serve(self, behavior, outcome: _Outcome):
        m = self._metrics

        def wrapped(request, context: grpc.ServicerContext):
            m.inflight.inc()
            code = grpc.StatusCode.OK
            try:
                return behavior(request, context)
            except Exception as exc:
                code = status_code_for(exc)
                if code is grpc.StatusCode.INTERNAL:
                    logger.exception("%s failed", outcome.method)
                context.abort(code, str(exc) or type(exc).__name__)
            finally:
                m.inflight.dec()
                if code is grpc.StatusCode.OK and not context.is_active():
                    code = _gone_code(context)
                outcome.finish(code)

        return wrapped

    def _shed(self, outcome: _Outcome, message: str):
        def refuse(request, context: grpc.ServicerContext):
            outcome.finish(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

        return self._on_shed_pool(refuse)

    def _on_shed_pool(self, behavior):
        # gRPC runs a handler on the pool named by this attribute (else its own): refusals and probes never
        # queue behind admitted RPCs waiting for a handler thread.
        if self._shed_pool is not None:

            def on_pool(request, context):
                return behavior(request, context)

            on_pool.experimental_thread_pool = self._shed_pool
            return on_pool
        return behavior
