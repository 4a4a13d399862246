"""The Open Inference Protocol over HTTP/REST (KServe v2 / Triton), on its own port, over the same core.

aiohttp serves it from one event loop in a thread of its own. A request is decoded on the loop (JSON, or the
binary-tensor extension, into the OIP gRPC message that :func:`oip.decode_infer_request` checks exactly as for
gRPC), queued on the shared dynamic batcher, and awaited without holding a thread. Every request is admitted
through the worker's shared in-flight limit (health probes excepted) and counted in
``recserve_requests_total{method="rest/<Call>",code}`` with the gRPC code it maps to, so one error-rate alert
covers both transports. Errors answer ``{"error": "<message naming the field>"}`` with the HTTP status of
:data:`HTTP_STATUS` (Google's gRPC → HTTP mapping: 400 bad input, 404 unknown model, 429 overloaded, 503
unavailable, 504 deadline).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import grpc
from aiohttp import web

import recserve
from recserve.errors import InvalidRequestError, ModelNotFoundError, UnavailableError
from recserve.server.admission import AdmissionLimit
from recserve.server.config import HttpLimits
from recserve.server.core import InferenceCore
from recserve.server.metrics import ServerMetrics
from recserve.server.oip import SCORES_OUTPUT, decode_batchable, input_metadata, parameter_deadline
from recserve.server.protos import oip_pb2
from recserve.server.rest_codec import (
    HEADER_LENGTH,
    TOO_DEEP,
    infer_request,
    infer_response,
    message_json,
    split_body,
    wants_binary,
)
from recserve.server.status import status_code_for
from recserve.server.triton_ext import EXTENSIONS, PLATFORM, Repository, model_config

logger = logging.getLogger(__name__)

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
_EXEMPT = frozenset({"ServerLive", "ServerReady"})  # probes answer under overload
_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"
REFUSED_CONNECTION = "rest/connection"  # the method label of connections refused over the limit


class RestApi:
    """The routes; each handler returns a response or raises a recserve error (mapped by the middleware)."""

    def __init__(
        self,
        core: InferenceCore,
        repository: Repository,
        metrics: ServerMetrics,
        admission: AdmissionLimit,
        *,
        device: str = "cpu",
        read_timeout_s: float = HttpLimits.read_timeout_s,
    ) -> None:
        self._core = core
        self._repository = repository
        self._metrics = metrics
        self._admission = admission
        self._device = device
        self._read_timeout_s = read_timeout_s

    def count_refused_connection(self) -> None:
        self._metrics.requests.labels(REFUSED_CONNECTION, grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()

    def app(self, max_body_bytes: int) -> web.Application:
        app = web.Application(client_max_size=max_body_bytes, middlewares=[self._outcome])
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
        """Admission, recserve error → HTTP status, and one count + latency observation per request."""
        start = time.perf_counter()
        route = request.match_info.route.name
        method = f"rest/{(route or 'unknown').split('.')[0]}"
        code, admitted = grpc.StatusCode.OK, False
        try:
            if route is None:
                code = grpc.StatusCode.UNIMPLEMENTED
                return _error(code, f"{request.method} {request.path}: no such endpoint", status=404)
            if route not in _EXEMPT:
                if request.can_read_body and not await self._body_arrived(request):
                    code = grpc.StatusCode.DEADLINE_EXCEEDED
                    message = f"request body: not received within {self._read_timeout_s:g} s"
                    response = _error(code, message, status=408)
                    response.force_close()  # the rest of the body may still be on its way
                    return response
                admitted = self._admission.try_acquire()
                if not admitted:
                    code = grpc.StatusCode.RESOURCE_EXHAUSTED
                    limit = self._admission.limit
                    message = (
                        f"server overloaded: {limit} requests in flight (--max-inflight); retry with backoff"
                    )
                    return _error(code, message)
            self._metrics.inflight.inc()
            try:
                return await handler(request)
            finally:
                self._metrics.inflight.dec()
        except web.HTTPException as exc:  # aiohttp's own refusals (body too large, bad method)
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED if exc.status == 413 else grpc.StatusCode.INVALID_ARGUMENT
            )
            return _error(code, exc.reason, status=exc.status)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the client went away
            raise
        except ConnectionError:  # the client went away while sending its body: nobody to answer
            code = grpc.StatusCode.CANCELLED
            return web.Response(status=499)
        except Exception as exc:
            code = status_code_for(exc)
            if code is grpc.StatusCode.INTERNAL:
                logger.exception("%s %s failed", request.method, request.path)
            return _error(code, str(exc) or type(exc).__name__)
        finally:
            if admitted:
                self._admission.release()
            self._metrics.requests.labels(method, code.name).inc()
            self._metrics.request_latency.labels(method).observe(time.perf_counter() - start)

    async def _body_arrived(self, request: web.Request) -> bool:
        """Reads the whole body (aiohttp keeps it for the handler); False when it took too long."""
        try:
            await asyncio.wait_for(request.read(), self._read_timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

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
        doc = await _json_object(request) if request.body_exists else {}
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
        doc = await _json_object(request) if request.body_exists else {}
        parameters = doc.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidRequestError("parameters: expected an object")
        model, authorization = request.match_info["model"], request.headers.get("Authorization")
        # Loading reads and warms up a package: off the event loop, so inference goes on meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, call, model, parameters, authorization)

    async def infer(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        name, version = request.match_info["model"], request.match_info.get("version", "")
        runner = self._core.find(name, version)
        doc, binary = split_body(await request.read(), request.headers.get(HEADER_LENGTH))
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


async def _json_object(request: web.Request) -> dict:
    try:
        doc = await request.json()
    except ValueError as exc:
        raise InvalidRequestError(f"request body: not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidRequestError(TOO_DEEP) from None
    if not isinstance(doc, dict):
        raise InvalidRequestError("request body: expected a JSON object")
    return doc


def _error(code: grpc.StatusCode, message: str, status: int | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status or HTTP_STATUS.get(code, 500))


class _Refused(asyncio.Protocol):
    """A connection over ``max_connections``: a 503 answer, then closed, before any byte is read."""

    def __init__(self, limit: int) -> None:
        body = json.dumps({"error": f"server overloaded: {limit} open HTTP connections; retry with backoff"})
        self._reply = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
        ).encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self._reply)  # type: ignore[attr-defined]
        transport.close()


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
        self._app = api.app(max_body_bytes)
        self._host, self._port, self._reuse_port = host, port, reuse_port
        self._drain_timeout_s = drain_timeout_s
        self._limits = limits or HttpLimits()
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
        )
        await self._runner.setup()
        handlers, limit = self._runner.server, self._limits.max_connections

        def connection() -> asyncio.Protocol:
            if len(handlers.connections) >= limit:
                self._api.count_refused_connection()
                return _Refused(limit)
            return handlers()

        # Our own listener over aiohttp's protocol factory: aiohttp's sites have no connection limit.
        self._listener = await self._loop.create_server(
            connection, self._host, self._port, reuse_port=self._reuse_port or None
        )
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
