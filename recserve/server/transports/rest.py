"""The Open Inference Protocol over HTTP/REST (KServe v2 / Triton), on its own port, over the same core.

aiohttp serves it from one event loop in a thread of its own. A request is decoded on the loop (JSON, or the
binary-tensor extension, into the OIP gRPC message that :func:`oip.decode_infer_request` checks exactly as for
gRPC), queued on the shared dynamic batcher, and awaited without holding a thread. Every request is admitted
through the worker's shared in-flight limit (health probes excepted) and counted in
``recserve_requests_total{method="rest/<Call>",code}`` with the gRPC code it maps to, by the same
:class:`~recserve.server.transports.status.Outcome` as a gRPC call, so one error-rate alert covers both
transports. Errors answer ``{"error": "<message naming the field>"}`` with the HTTP status of
:data:`~recserve.server.transports.status.HTTP_STATUS` (Google's gRPC → HTTP mapping: 400 bad input, 404
unknown model, 429 overloaded, 503 unavailable, 504 deadline).

A request's body is read by :func:`rest_body.read_body` under the worker's :class:`MemoryBudget` (aiohttp's
own inflation is off), within ``--http-read-timeout`` (408 after), and only then does the request take an
in-flight slot: 413 for a body over ``--max-message-mb``, 503 with ``Retry-After`` while the budget is spent.
:class:`RestServer` caps open connections; at the cap a new connection closes the one that has been idle
longest (see :class:`~recserve.server.operations.config.HttpLimits`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable

import grpc
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

import recserve
from recserve.errors import DeadlineExceededError, InvalidRequestError, ModelNotFoundError, UnavailableError
from recserve.server.dataplane.core import InferenceCore
from recserve.server.operations.config import HttpLimits
from recserve.server.operations.metrics import ServerMetrics
from recserve.server.transports.admission import AdmissionLimit
from recserve.server.transports.budget import (
    DECODE_FACTOR,
    BudgetExhausted,
    MemoryBudget,
    Reservation,
    default_request_budget,
)
from recserve.server.transports.handlers import DecodeFailureLog
from recserve.server.transports.oip import SCORES_OUTPUT, decode_batchable, input_metadata, parameter_deadline
from recserve.server.transports.protos import oip_pb2
from recserve.server.transports.rest_body import BodyTooLarge, read_body
from recserve.server.transports.rest_codec import (
    HEADER_LENGTH,
    TOO_DEEP,
    infer_request,
    infer_response,
    message_json,
    split_body,
    wants_binary,
)
from recserve.server.transports.rest_connections import ConnectionPool, Refused, Tracked
from recserve.server.transports.status import HTTP_STATUS, Outcome
from recserve.server.transports.triton_ext import EXTENSIONS, PLATFORM, Repository, model_config

logger = logging.getLogger(__name__)

_EXEMPT = frozenset({"ServerLive", "ServerReady"})  # probes answer under overload
_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"
REFUSED_CONNECTION = "rest/connection"  # the method label of connections refused over the limit
MALFORMED = "rest/malformed"  # the method label of requests aiohttp's parser refused (400)
RETRY_AFTER_S = 1  # what a 503 for a spent memory budget tells the client to wait
# Typed request keys where aiohttp has them (3.13+; it warns about plain strings), strings before.
_KEY = getattr(web, "RequestKey", lambda name, _type: f"recserve.{name}")
_BODY = _KEY("body", bytes)  # read by the middleware under the budget, before admission
_RESERVATION = _KEY("reservation", Reservation)  # the request's share of the budget


class RestApi:
    """The routes; each handler returns a response or raises a recserve error (mapped by the middleware).

    ``budget`` is the worker's REST request memory (``--request-memory-mb``); None: one sized by
    :func:`default_request_budget` for one worker.
    """

    def __init__(
        self,
        core: InferenceCore,
        repository: Repository,
        metrics: ServerMetrics,
        admission: AdmissionLimit,
        *,
        device: str = "cpu",
        read_timeout_s: float = HttpLimits.read_timeout_s,
        budget: MemoryBudget | None = None,
        recommender=None,
    ) -> None:
        self._core = core
        self._recommender = recommender  # a RecommendService: its pipeline is a model of its own name
        self._repository = repository
        self._metrics = metrics
        self._admission = admission
        self._device = device
        self._read_timeout_s = read_timeout_s
        self.budget = budget
        self._max_body_bytes = 0
        self._malformed_log = DecodeFailureLog()

    def count_refused_connection(self) -> None:
        self._metrics.requests.labels(REFUSED_CONNECTION, grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()

    def protocol_logger(self) -> logging.LoggerAdapter:
        """The logger for aiohttp's connection handlers: malformed requests counted and rate-limited."""
        return _ProtocolLog(self._malformed)

    def _malformed(self, exc: HttpProcessingError) -> None:
        self._metrics.requests.labels(MALFORMED, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
        self._malformed_log.record("HTTP request", f"{type(exc).__name__}: {' '.join(str(exc).split())}")

    def app(self, max_body_bytes: int, *, middlewares: tuple = ()) -> web.Application:
        """The routes; ``middlewares`` run around this API's own (outermost first)."""
        self._max_body_bytes = max_body_bytes
        if self.budget is None:
            self.budget = MemoryBudget(default_request_budget(1, max_body_bytes))
        app = web.Application(client_max_size=max_body_bytes, middlewares=[*middlewares, self._outcome])
        r = app.router
        r.add_get("/v2/health/live", self.live, name="ServerLive")
        r.add_get("/v2/health/ready", self.ready, name="ServerReady")
        r.add_get("/v2", self.server_metadata, name="ServerMetadata")
        r.add_get("/v2/models/stats", self.statistics, name="ModelStatistics.all")
        r.add_post("/v2/repository/index", self.repository_index, name="RepositoryIndex")
        r.add_post("/v2/repository/models/{model}/load", self.load, name="RepositoryModelLoad")
        r.add_post("/v2/repository/models/{model}/unload", self.unload, name="RepositoryModelUnload")
        for base, suffix in ((_MODEL, ""), (_VERSION, ".version")):
            r.add_get(base, self.model_metadata, name=f"ModelMetadata{suffix}")
            r.add_get(f"{base}/ready", self.model_ready, name=f"ModelReady{suffix}")
            r.add_get(f"{base}/config", self.config, name=f"ModelConfig{suffix}")
            r.add_get(f"{base}/stats", self.statistics, name=f"ModelStatistics{suffix}")
            r.add_post(f"{base}/infer", self.infer, name=f"ModelInfer{suffix}")
        return app

    @web.middleware
    async def _outcome(self, request: web.Request, handler: Callable[[web.Request], Awaitable]):
        """Body under the budget, then the request's :class:`Outcome`: admission, error → status, one count
        and latency per request, as for a gRPC call."""
        route = request.match_info.route.name
        outcome = Outcome(self._metrics, f"rest/{(route or 'unknown').split('.')[0]}", self._admission)
        code = grpc.StatusCode.OK
        reservation = request[_RESERVATION] = self.budget.reserve()
        try:
            if route is None:
                code, response = _unrouted(request)
                return response
            if route not in _EXEMPT:
                late = await self._receive(request)
                if late is not None:
                    code, response = late
                    return response
                outcome.admit()
            return await handler(request)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the client went away
            raise
        except Exception as exc:
            code, response = _failure(exc, outcome)
            # The failed frames' locals may hold a body (and, raised through wait_for's task, sit in a
            # reference cycle until the garbage collector runs): drop them now, as the budget assumes.
            traceback.clear_frames(exc.__traceback__)
            return response
        finally:
            request.pop(_BODY, None)  # a refused request's body goes with its reservation
            reservation.release()
            outcome.finish(code)

    async def _receive(self, request: web.Request) -> tuple[grpc.StatusCode, web.Response] | None:
        """Reads the body (kept as ``request[_BODY]``); 408 if it is late."""
        request[_BODY] = b""
        if not request.body_exists:
            return None
        read = read_body(request, request[_RESERVATION], self._max_body_bytes)
        try:
            request[_BODY] = await asyncio.wait_for(read, self._read_timeout_s)
        except asyncio.TimeoutError:
            code = grpc.StatusCode.DEADLINE_EXCEEDED
            message = f"request body: not received within {self._read_timeout_s:g} s"
            response = _error(code, message, status=408)
            response.force_close()  # the rest of the body may still be on its way
            return code, response
        return None

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ready = self._core.ready
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        doc = {"name": "recserve", "version": recserve.__version__, "extensions": list(EXTENSIONS)}
        return web.json_response(doc)

    def _runner(self, request: web.Request):
        return self._core.find(request.match_info["model"], request.match_info.get("version", ""))

    async def model_metadata(self, request: web.Request) -> web.Response:
        if self._pipeline(request.match_info["model"]) is not None:
            from recserve.server.transports.oip_recommend import pipeline_metadata

            message = pipeline_metadata(self._pipeline(request.match_info["model"]))
            return web.json_response(message_json(message))
        s = self._runner(request).schema
        inputs = [{"name": n, "datatype": d, "shape": shape} for n, d, shape in input_metadata(s)]
        outputs = [{"name": SCORES_OUTPUT, "datatype": "FP32", "shape": [-1]}]
        doc = {"name": s.model_name, "versions": [s.version], "platform": PLATFORM}
        return web.json_response({**doc, "inputs": inputs, "outputs": outputs})

    async def model_ready(self, request: web.Request) -> web.Response:
        try:
            self._runner(request)
        except (ModelNotFoundError, UnavailableError):
            ready = False
        else:
            ready = self._core.ready
        doc = {"name": request.match_info["model"], "ready": ready}
        return web.json_response(doc, status=200 if ready else 503)

    async def config(self, request: web.Request) -> web.Response:
        runner = self._runner(request)
        return web.json_response(
            message_json(model_config(runner, input_metadata(runner.schema), self._device))
        )

    async def statistics(self, request: web.Request) -> web.Response:
        if "model" in request.match_info:
            runners = [self._runner(request)]
        else:  # every model: the served one, if loaded
            runners = [r for r in (self._core.current,) if r is not None]
        # With several workers the statistics are gathered from all of them: off the event loop.
        loop = asyncio.get_running_loop()
        stats = [await loop.run_in_executor(None, self._repository.statistics, r) for r in runners]
        return web.json_response({"model_stats": [message_json(s) for s in stats]})

    async def repository_index(self, request: web.Request) -> web.Response:
        doc = _json_object(request[_BODY]) if request[_BODY] else {}
        ready_only = doc.get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidRequestError("ready: expected true or false")
        return web.json_response([message_json(m) for m in self._repository.index(ready_only)])

    async def load(self, request: web.Request) -> web.Response:
        await self._repository_call(request, self._repository.load)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        await self._repository_call(request, self._repository.unload)
        return web.Response(status=200)

    async def _repository_call(self, request: web.Request, call) -> None:
        doc = _json_object(request[_BODY]) if request[_BODY] else {}
        parameters = doc.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidRequestError("parameters: expected an object")
        model, authorization = request.match_info["model"], request.headers.get("Authorization")
        # Loading reads and warms up a package: off the event loop, so inference goes on meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, call, model, parameters, authorization)

    def _pipeline(self, name: str):
        service = self._recommender
        return service if service is not None and name == service.model_name else None

    async def _recommend(self, request: web.Request, service, received: float) -> web.Response:
        """A request to the pipeline model (recserve.server.transports.oip_recommend), off the loop's thread
        only for its batch."""
        from recserve.server.transports.oip_recommend import decode_pipeline_request, pipeline_response

        body = request.pop(_BODY)
        request[_RESERVATION].resize(DECODE_FACTOR * len(body))
        doc, binary = split_body(body, request.headers.get(HEADER_LENGTH))
        del body
        name, version = request.match_info["model"], request.match_info.get("version", "")
        req = infer_request(doc, binary, name, version)
        user, deadline = decode_pipeline_request(service, req, received, None)
        future = service.submit(user, deadline)
        wait = None if deadline is None else max(0.0, deadline - time.monotonic()) + 1.0
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), wait)
        except asyncio.TimeoutError:
            future.cancel()
            raise DeadlineExceededError(
                "the request's deadline passed while its batch was computed"
            ) from None
        except Exception:
            pass  # result() raises it
        body, headers = infer_response(pipeline_response(req, service.result(future)), wants_binary(req))
        return web.Response(body=body, headers=headers)

    async def infer(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        name, version = request.match_info["model"], request.match_info.get("version", "")
        if self._pipeline(name) is not None:
            return await self._recommend(request, self._pipeline(name), received)
        runner = self._core.find(name, version)
        body = request.pop(_BODY)
        # The body, the parsed JSON and the decoded tensors exist at once while the request is decoded.
        request[_RESERVATION].resize(DECODE_FACTOR * len(body))
        doc, binary = split_body(body, request.headers.get(HEADER_LENGTH))
        del body
        req = infer_request(doc, binary, name, version)
        arrays = decode_batchable(req, runner.schema, runner.oip_layout)
        deadline = parameter_deadline(req.parameters, received)
        ticket = self._core.submit(
            arrays, deadline=deadline, model_name=name, model_version=version, received=received
        )
        waiting = asyncio.wrap_future(ticket.future)  # cancelled with the request when the client leaves
        try:
            await asyncio.wait_for(waiting, self._core.wait_timeout(ticket))
        except asyncio.TimeoutError:
            raise self._core.expired(ticket) from None
        except Exception:
            pass  # complete() raises it and counts it
        result = self._core.complete(ticket)
        resp = oip_pb2.ModelInferResponse(
            model_name=result.model_name, model_version=result.model_version, id=req.id
        )
        resp.outputs.add(name=SCORES_OUTPUT, datatype="FP32", shape=[result.scores.numel()])
        resp.raw_output_contents.append(result.scores.numpy().astype("<f4").tobytes())
        body, headers = infer_response(resp, wants_binary(req))
        return web.Response(body=body, headers=headers)


def _json_object(body: bytes) -> dict:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"request body: not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidRequestError(TOO_DEEP) from None
    if not isinstance(doc, dict):
        raise InvalidRequestError("request body: expected a JSON object")
    return doc


def _error(
    code: grpc.StatusCode, message: str, status: int | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": message}, status=status or HTTP_STATUS.get(code, 500), headers=headers)


def _failure(exc: Exception, outcome: Outcome) -> tuple[grpc.StatusCode, web.Response]:
    """The code and the answer for an exception a request raised."""
    if isinstance(exc, BodyTooLarge):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        return code, _error(code, str(exc), status=413)
    if isinstance(exc, BudgetExhausted):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        return code, _error(code, str(exc), status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, web.HTTPException):  # aiohttp's own refusals
        code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.status == 413 else grpc.StatusCode.INVALID_ARGUMENT
        return code, _error(code, exc.reason, status=exc.status)
    if isinstance(exc, ConnectionError):  # the client went away while sending its body: nobody to answer
        return grpc.StatusCode.CANCELLED, web.Response(status=499)
    code = outcome.failed(exc)
    return code, _error(code, str(exc) or type(exc).__name__)


def _unrouted(request: web.Request) -> tuple[grpc.StatusCode, web.Response]:
    """404 for a path we do not serve; 405 (with ``Allow``) for a method a path does not take."""
    code = grpc.StatusCode.UNIMPLEMENTED
    exc = getattr(request.match_info, "http_exception", None)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"{request.method} {request.path}: method not allowed; use {allowed}"
        return code, _error(code, message, status=405, headers={"Allow": allowed})
    return code, _error(code, f"{request.method} {request.path}: no such endpoint", status=404)


class _ProtocolLog(logging.LoggerAdapter):
    """aiohttp's connection logger, except for requests its parser refused.

    aiohttp answers a malformed request 400 itself and logs it with a traceback; anyone can send them, so
    they go to ``on_malformed`` (counted, logged once per interval) instead.
    """

    def __init__(self, on_malformed: Callable[[HttpProcessingError], None]) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self._on_malformed = on_malformed

    def log(self, level: int, msg, *args, **kwargs) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self._on_malformed(exc)
            return
        super().log(level, msg, *args, **kwargs)


class RestServer:
    """Runs a :class:`RestApi` on ``host:port`` in a daemon thread with its own event loop."""

    def __init__(
        self,
        api: RestApi,
        host: str,
        port: int,
        *,
        max_body_bytes: int,
        drain_timeout_s: float,
        reuse_port: bool = False,
        limits: HttpLimits | None = None,
    ) -> None:
        self._api = api
        self._limits = limits or HttpLimits()
        self.connections = ConnectionPool(self._limits.max_connections)
        self._app = api.app(max_body_bytes, middlewares=(self.connections.middleware,))
        self._host, self._port, self._reuse_port = host, port, reuse_port
        self._drain_timeout_s = drain_timeout_s
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="rest", daemon=True)
        self.port = 0

    def start(self) -> int:
        """Binds and serves; returns the bound port."""
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(60)
        logger.info("Open Inference Protocol REST on http://%s:%d/v2", self._host, self.port)
        return self.port

    async def _start(self) -> int:
        self._runner = web.AppRunner(
            self._app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self._drain_timeout_s,
            keepalive_timeout=self._limits.idle_timeout_s,  # also bounds the wait for a request head
            auto_decompress=False,  # bodies are inflated by rest_body, under the memory budget
            logger=self._api.protocol_logger(),
        )
        await self._runner.setup()
        handlers, pool = self._runner.server, self.connections

        def connection() -> asyncio.Protocol:
            handler = handlers()
            if not pool.admit(handler):
                self._api.count_refused_connection()
                return Refused(pool.limit)
            return Tracked(handler, pool)

        # Our own listener over aiohttp's protocol factory: aiohttp's sites have no connection limit.
        self._listener = await self._loop.create_server(
            connection,
            self._host,
            self._port,
            reuse_port=self._reuse_port or None,
            backlog=pool.accept_batch,
        )
        _deepen_listen_queue(self._listener, max(1024, pool.limit))
        return self._listener.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stops accepting, lets requests in flight finish (up to the drain timeout), stops the loop."""
        if self._listener is not None:
            self._loop.call_soon_threadsafe(self._listener.close)
        if self._runner is not None:
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            future.result(self._drain_timeout_s + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _deepen_listen_queue(listener: asyncio.AbstractServer, depth: int) -> None:
    """asyncio uses ``backlog`` both as the kernel's queue of connections waiting to be accepted and as how
    many it accepts per poll; a short queue drops connections (clients retry a second later), so the queue
    is made deep again, on the same sockets, after asyncio has set it."""
    for sock in listener.sockets:
        try:
            with socket.socket(fileno=os.dup(sock.fileno())) as same:
                same.listen(depth)
        except OSError as exc:  # the listener still works, with the shorter queue
            logger.warning("REST listener: cannot deepen its connection queue to %d: %s", depth, exc)
