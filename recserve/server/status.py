"""The one place that maps recserve's exceptions to gRPC status codes, and counts and times every RPC.

Servicers raise; :class:`StatusInterceptor` catches, aborts the RPC with the mapped code and the exception's
message, and records ``recserve_requests_total{method,code}`` and ``recserve_request_latency_seconds``.
"""

from __future__ import annotations

import logging
import time

import grpc

from recserve.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    OverloadedError,
    PackageError,
    RecServeError,
    UnavailableError,
)
from recserve.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)

_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (PackageError, grpc.StatusCode.FAILED_PRECONDITION),
    (RecServeError, grpc.StatusCode.INTERNAL),
)


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC code for an exception a handler raised (INTERNAL for anything unexpected)."""
    for exc_type, code in _CODES:
        if isinstance(exc, exc_type):
            return code
    return grpc.StatusCode.INTERNAL


class StatusInterceptor(grpc.ServerInterceptor):
    """Wraps every unary-unary handler: exception → status code, plus request count, latency and in-flight."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.lstrip("/")
        return grpc.unary_unary_rpc_method_handler(
            self._wrap(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap(self, behavior, method: str):
        m = self._metrics
        latency = m.request_latency.labels(method)

        def wrapped(request, context: grpc.ServicerContext):
            start = time.perf_counter()
            m.inflight.inc()
            code = grpc.StatusCode.OK
            try:
                return behavior(request, context)
            except Exception as exc:
                code = status_code_for(exc)
                if code is grpc.StatusCode.INTERNAL:
                    logger.exception("%s failed", method)
                context.abort(code, str(exc) or type(exc).__name__)
            finally:
                m.inflight.dec()
                m.requests.labels(method, code.name).inc()
                latency.observe(time.perf_counter() - start)

        return wrapped
