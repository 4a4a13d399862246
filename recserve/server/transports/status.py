"""The one place that maps recserve's exceptions to status codes, admits requests, and counts every outcome.

:class:`Outcome` is one request's record for either transport: it takes the request's in-flight slot, maps the
error it ended with to a gRPC code (and :data:`HTTP_STATUS` that to an HTTP status), and counts it once. The
gRPC interceptor below and the REST middleware (:mod:`recserve.server.transports.rest`) both end every request
through it, so admission, the overload message and the metrics are the same on both.

:class:`StatusInterceptor` wraps every handler of a server. A unary call is read as bytes: only once its
request message has arrived (:mod:`recserve.server.transports.reads` ends calls whose message is late) does it
take an in-flight slot (:mod:`recserve.server.transports.admission`), reserve ``DECODE_FACTOR`` times its size
from the worker's request memory budget (:mod:`recserve.server.transports.budget`), inflate if compressed, and
parse. Servicers raise; the interceptor catches, aborts the RPC with the mapped code and the exception's
message, and records ``recserve_requests_total{method,code}`` and ``recserve_request_latency_seconds`` once
per RPC, whatever its end:

- handled: the code of the reply (OK or the mapped error); a reply the client no longer waits for (it
  cancelled, or its deadline passed while the handler ran) counts as CANCELLED or DEADLINE_EXCEEDED;
- refused for load (in-flight slots, budget, queue lag) or by gRPC's own ``maximum_concurrent_rpcs``
  ("Concurrent RPC limit exceeded!"): RESOURCE_EXHAUSTED;
- ended by the read watch: DEADLINE_EXCEEDED (message not in within ``--grpc-read-timeout``) or
  RESOURCE_EXHAUSTED (too many slow messages at once);
- ended before a handler thread picked it up (the client cancelled or its deadline passed first, or gRPC
  dropped the message, e.g. one over ``--max-message-mb``): CANCELLED;
- addressed to a method the server does not have: UNIMPLEMENTED with ``method="unknown"`` (the name is the
  client's choice, so it never becomes a label).

gRPC calls no handler in the last cases, so the interceptor notices through a finalizer on the handler it
returned, which gRPC drops once done with it. gRPC calls ``intercept_service`` on its polling thread as an
RPC arrives and, when it refuses the RPC for its concurrency limit, drops the handler right there, on that
thread; a handler dropped on any other thread belonged to an RPC that ended while waiting for a pool thread.
Streaming calls (health ``Watch``, reflection) run on a small pool of their own and are not counted.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
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
from recserve.server.operations.metrics import ServerMetrics
from recserve.server.transports import reads
from recserve.server.transports.admission import AdmissionLimit, QueueLag, answer_probe
from recserve.server.transports.budget import DECODE_FACTOR, MemoryBudget

logger = logging.getLogger(__name__)

_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (reads.MessageTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (PackageError, grpc.StatusCode.FAILED_PRECONDITION),
    (RecServeError, grpc.StatusCode.INTERNAL),
)
# Google's gRPC -> HTTP mapping, as the REST API answers.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# Probes must answer under overload: these methods are never refused (spare handler threads serve them).
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
UNKNOWN_METHOD = "unknown"


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC code for an exception a handler raised (INTERNAL for anything unexpected)."""
    for exc_type, code in _CODES:
        if isinstance(exc, exc_type):
            return code
    return grpc.StatusCode.INTERNAL


class Outcome:
    """One request's record: in flight once admitted, counted exactly once (``finish``), whichever transport
    and whichever of handler or finalizer gets there first.

    No lock: the finalizer runs only once gRPC holds no reference to the handler, i.e. after it returned.
    """

    __slots__ = ("method", "start", "done", "arrival_thread", "_metrics", "_admission", "_admitted")

    def __init__(self, metrics: ServerMetrics, method: str, admission: AdmissionLimit | None = None) -> None:
        self._metrics = metrics
        self._admission = admission
        self._admitted = False
        self.method = method
        self.start = time.perf_counter()
        self.done = False
        self.arrival_thread = threading.get_ident()

    def admit(self) -> None:
        """Takes an in-flight slot (none to take without an admission limit), or raises OverloadedError."""
        if self._admission is None:
            return
        if not self._admission.try_acquire():
            raise OverloadedError(
                f"server overloaded: {self._admission.limit} requests in flight (--max-inflight); "
                "retry with backoff"
            )
        self._admitted = True
        self._metrics.inflight.inc()

    def failed(self, exc: BaseException) -> grpc.StatusCode:
        """The code a request that raised ``exc`` ends with; an unexpected error is logged with its trace."""
        code = status_code_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            logger.error("%s failed", self.method, exc_info=exc)
        return code

    def finish(self, code: grpc.StatusCode) -> None:
        """Frees the request's slot, counts it with ``code`` and records its latency (once)."""
        if self.done:
            return
        self.done = True
        if self._admitted:
            self._metrics.inflight.dec()
            self._admission.release()
        self._metrics.requests.labels(self.method, code.name).inc()
        self._metrics.request_latency.labels(self.method).observe(time.perf_counter() - self.start)


def _never_ran(outcome: Outcome) -> None:
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
    """Wraps every handler: a unary call is admitted only once its request message has arrived, reserves its
    bytes from the request memory budget, is inflated and parsed here, then exception → status code, count,
    latency and in-flight. Streaming calls (health ``Watch``, reflection) run on ``streaming_pool``.

    ``admission`` None admits everything (the admin server); ``shed_pool`` runs the refusals for lag;
    ``budget`` None reserves nothing.
    """

    def __init__(
        self,
        metrics: ServerMetrics,
        *,
        admission: AdmissionLimit | None = None,
        lag: QueueLag | None = None,
        shed_pool: futures.ThreadPoolExecutor | None = None,
        streaming_pool: futures.ThreadPoolExecutor | None = None,
        budget: MemoryBudget | None = None,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self._metrics = metrics
        self._admission = admission
        self._lag = lag
        self._shed_pool = shed_pool
        self._streaming_pool = streaming_pool
        self._budget = budget
        self._max_message_bytes = max_message_bytes
        self._probe_handler = grpc.unary_unary_rpc_method_handler(self._on_pool(answer_probe, shed_pool))
        self._streaming: dict[grpc.RpcMethodHandler, grpc.RpcMethodHandler] = {}

    def intercept_service(self, continuation, handler_call_details):
        # Runs on gRPC's polling thread as the RPC arrives, before it waits for a handler thread.
        handler = continuation(handler_call_details)
        if handler is None:
            self._metrics.requests.labels(UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED.name).inc()
            return None
        if handler.unary_unary is None:
            return self._streaming_handler(handler)
        full_name = handler_call_details.method
        lag = self._lag
        if lag is not None and lag.is_probe(full_name, handler_call_details.invocation_metadata):
            return self._probe_handler  # not counted: the server's own measurement
        exempt = self._admission is None or full_name.startswith(EXEMPT_PREFIXES)
        outcome = Outcome(self._metrics, full_name.lstrip("/"), None if exempt else self._admission)
        if not exempt and lag is not None and lag.overloaded():
            refusal = (
                f"server overloaded: new requests wait {lag.lag_s() * 1e3:.0f} ms before a handler sees them "
                f"(over {lag.target_s * 1e3:.0f} ms, --max-queue-lag-ms); retry with backoff"
            )
            behavior = self._shed(outcome, refusal)
            make = grpc.stream_unary_rpc_method_handler  # refused without reading the request (below)
        else:
            behavior = self._serve(handler, outcome)
            make = grpc.unary_unary_rpc_method_handler
        setattr(behavior, reads.OUTCOME_ATTRIBUTE, outcome)
        weakref.finalize(behavior, _never_ran, outcome)
        # No deserializer: the request arrives as bytes, inflated and parsed under the budget by _serve.
        return make(behavior, response_serializer=handler.response_serializer)

    def _serve(self, handler: grpc.RpcMethodHandler, outcome: Outcome):
        behavior, deserialize = handler.unary_unary, handler.request_deserializer

        def wrapped(raw: bytes, context: grpc.ServicerContext):
            if not reads.message_arrived():
                context.abort(grpc.StatusCode.CANCELLED, "the call ended before its request arrived")
            code, message, held, request = grpc.StatusCode.OK, "", None, None
            try:
                outcome.admit()
                if self._budget is not None:
                    held = self._budget.reserve(len(raw) * DECODE_FACTOR)
                raw = reads.inflated_message(raw, self._max_message_bytes, held)
                if held is not None:
                    held.resize(len(raw) * DECODE_FACTOR)
                request = self._decode(outcome.method, deserialize, raw)
                raw = b""  # parsed: its bytes may go while the request is handled
                return behavior(request, context)
            except Exception as exc:
                code, message = outcome.failed(exc), str(exc) or type(exc).__name__
            finally:
                if held is not None:
                    held.release()
                if code is grpc.StatusCode.OK and not context.is_active():
                    code = _gone_code(context)
                outcome.finish(code)
            # abort() raises, and its traceback keeps this frame: drop the request first, or a large one
            # stays resident until the cyclic garbage collector happens to run.
            raw = request = None
            context.abort(code, message)

        return wrapped

    @staticmethod
    def _decode(method: str, deserialize, raw: bytes):
        if deserialize is None:
            return raw
        try:
            return deserialize(raw)  # ours never raise (recserve.server.transports.handlers); health's may
        except Exception as exc:
            raise InvalidRequestError(
                f"/{method}: the request is not a valid message ({str(exc) or type(exc).__name__})"
            ) from None

    def _streaming_handler(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """A streaming method on the streaming pool, its messages inflated under the size limit, its read
        clock stopped by its request (a request stream: by the first message)."""
        wrapped = self._streaming.get(handler)
        if wrapped is not None:
            return wrapped
        limit = self._max_message_bytes
        inner = handler.request_deserializer or (lambda raw: raw)

        def deserialize(raw: bytes):
            return inner(reads.inflated_message(raw, limit, None))

        if handler.request_streaming:
            behavior = handler.stream_stream or handler.stream_unary

            def run(request_iterator, context):
                return behavior(_ArrivalIterator(request_iterator), context)

        else:
            behavior = handler.unary_stream

            def run(request, context):
                if not reads.message_arrived():
                    context.abort(grpc.StatusCode.CANCELLED, "the call ended before its request arrived")
                return behavior(request, context)

        run = self._on_pool(run, self._streaming_pool)
        kinds = {
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }
        make = kinds[(handler.request_streaming, handler.response_streaming)]
        wrapped = make(run, request_deserializer=deserialize, response_serializer=handler.response_serializer)
        self._streaming[handler] = wrapped
        return wrapped

    def _shed(self, outcome: Outcome, message: str):
        # A request-streaming behaviour: gRPC Python reads a unary call's message before its handler runs,
        # so a unary refusal of a message that never completes (a held stream) would hold a shed thread
        # until the read deadline, and the refusals, and the lag probes answered on the same pool, would
        # queue behind it: the lag would read as growing for as long as streams are held, and every call
        # would be shed into that queue to wait out its deadline. Marked as a refusal, the watched pool ends
        # it as gRPC submits it, before any pool thread wakes (reads.WatchedPool); ``refuse`` runs only on
        # a pool that is not watched.
        def refuse(requests, context: grpc.ServicerContext):
            if reads.message_arrived():
                outcome.finish(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

        behavior = self._on_pool(refuse, self._shed_pool)
        setattr(behavior, reads.REFUSAL_ATTRIBUTE, message)
        return behavior

    @staticmethod
    def _on_pool(behavior, pool: futures.ThreadPoolExecutor | None):
        # gRPC runs a handler on the pool named by this attribute (else its own): refusals, probes and streams
        # never queue behind admitted RPCs waiting for a handler thread.
        if pool is None:
            return behavior

        def on_pool(request, context):
            return behavior(request, context)

        on_pool.experimental_thread_pool = pool
        return on_pool


class _ArrivalIterator:
    """A request stream that stops its call's read clock at its first message."""

    def __init__(self, requests) -> None:
        self._requests = requests
        self._first = True

    def __iter__(self):
        return self

    def __next__(self):
        request = next(self._requests)
        if self._first:
            self._first = False
            reads.message_arrived()
        return request
