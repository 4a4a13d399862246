"""Method handlers for our gRPC services, built with request deserialisers that never raise.

grpcio's generated ``add_*Servicer_to_server`` parse with ``Message.FromString``: a message that does not
parse then answers INTERNAL before any of our code (or the status interceptor) runs, is missing from the
metrics, and logs a traceback per message. Ours hand the handler an :class:`UndecodableRequest` instead; the
handler raises ``InvalidRequestError``, so the status interceptor answers INVALID_ARGUMENT and counts it like
any other bad request. The log gets one line per interval with a count, not one per message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import grpc

from recserve.errors import InvalidRequestError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UndecodableRequest:
    """What the deserialiser hands the handler when the bytes are not a ``message_type``."""

    message_type: str
    error: str


class DecodeFailureLog:
    """Logs undecodable requests at most once per ``interval_s``, with how many came since the last line.

    The first failure is logged at once; later ones in the interval are counted, and a timer logs that count
    when the interval ends, so a burst that then stops is still reported.
    """

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._last = ("", "")
        self._next_log = float("-inf")
        self._timer: threading.Timer | None = None

    def record(self, method: str, error: str) -> None:
        with self._lock:
            self._count += 1
            self._last = (method, error)
            now = self._clock()
            if now < self._next_log:
                if self._timer is None:
                    self._timer = threading.Timer(self._next_log - now, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def flush(self) -> None:
        """Logs the failures counted since the last line (none: nothing) and starts a new interval."""
        with self._lock:
            count, self._count = self._count, 0
            if self._timer is not None:
                self._timer.cancel()  # a no-op when the timer itself is calling
                self._timer = None
            if not count:
                return
            self._next_log = self._clock() + self.interval_s
            method, error = self._last
        logger.warning(
            "%d undecodable request(s) answered INVALID_ARGUMENT (logged at most every %.0f s); last: %s: %s",
            count,
            self.interval_s,
            method,
            error,
        )


def _deserializer(message_cls, method: str, log: DecodeFailureLog) -> Callable[[bytes], object]:
    def deserialize(data: bytes):
        try:
            return message_cls.FromString(data)
        except Exception as exc:  # upb raises DecodeError; the pure-Python parser may raise others
            error = str(exc) or type(exc).__name__
            log.record(method, error)
            return UndecodableRequest(message_cls.DESCRIPTOR.full_name, error)

    return deserialize


def _guarded(behavior: Callable, method: str) -> Callable:
    def handle(request, context: grpc.ServicerContext):
        if isinstance(request, UndecodableRequest):
            raise InvalidRequestError(
                f"{method}: the request is not a valid {request.message_type} message ({request.error})"
            )
        return behavior(request, context)

    return handle


def method_handlers(
    pb2_module: ModuleType, service: str, servicer: object, log: DecodeFailureLog
) -> dict[str, grpc.RpcMethodHandler]:
    """``{method name: handler}`` for every unary RPC of ``service`` (declared in ``pb2_module``)."""
    descriptor = pb2_module.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for m in descriptor.methods:
        request_cls = getattr(pb2_module, m.input_type.name)  # our RPC messages are all top-level
        response_cls = getattr(pb2_module, m.output_type.name)
        full = f"/{descriptor.full_name}/{m.name}"
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(getattr(servicer, m.name), full),
            request_deserializer=_deserializer(request_cls, full, log),
            response_serializer=response_cls.SerializeToString,
        )
    return handlers


def add_service(
    server: grpc.Server, pb2_module: ModuleType, service: str, servicer: object, log: DecodeFailureLog
) -> None:
    """What the generated ``add_<service>Servicer_to_server`` does, with our deserialisers."""
    name = pb2_module.DESCRIPTOR.services_by_name[service].full_name
    handlers = method_handlers(pb2_module, service, servicer, log)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
