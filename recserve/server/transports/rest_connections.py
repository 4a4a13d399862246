"""The REST server's open connections: a cap that idle and half-open connections cannot lock others out of.

aiohttp's listener has no connection limit, and a limit that refuses new connections lets a few thousand idle
sockets (or request heads sent a byte at a time) lock every real client out until they time out. So at the
cap a new connection closes the connection that has been idle longest, and is refused (503) only when every
open connection has a request in progress (see :class:`~recserve.server.operations.config.HttpLimits`).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler


class Refused(asyncio.Protocol):
    """A connection over ``max_connections`` while every open one has a request in progress: a 503 answer,
    then closed, before any byte is read."""

    def __init__(self, limit: int) -> None:
        body = json.dumps(
            {"error": f"server overloaded: {limit} open HTTP connections, all busy; retry with backoff"}
        )
        self._reply = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
        ).encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self._reply)  # type: ignore[attr-defined]
        transport.close()


class ConnectionPool:
    """A server's open connections: the idle ones in the order they went quiet, the busy ones counted.

    A connection is busy from the moment its request reaches the handlers until its response is written;
    otherwise it is idle. At the limit the one closed to make room is, first, the connection silent longest
    among those that never sent a complete request (idle or half-open sockets), else the one silent longest
    between keep-alive requests; bytes arriving on an idle connection move it to the back of its line. A
    connection that has just been accepted, or has just had its response, is spared until the event loop
    has polled its socket once more, so a client that sent its request at once is not closed merely because
    the loop had not read it yet (unless nothing else is idle).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.closed_idle = 0  # connections closed to make room for new ones
        self._new: OrderedDict[RequestHandler, None] = OrderedDict()  # no request yet
        self._kept: OrderedDict[RequestHandler, None] = OrderedDict()  # between keep-alive requests
        self._busy: dict[RequestHandler, int] = {}  # requests in progress (pipelined ones overlap)
        self._spared: set[RequestHandler] = set()

    def __len__(self) -> int:
        return len(self._new) + len(self._kept) + len(self._busy)

    @property
    def accept_batch(self) -> int:
        """How many connections the listener may accept before the loop reads: a quarter of the limit (at
        most asyncio's 100), so one burst cannot close connections that were not yet spared and read."""
        return max(1, min(100, self.limit // 4))

    def admit(self, handler: RequestHandler) -> bool:
        """Takes a new connection, closing an idle one at the limit (see above); False if all are busy."""
        if len(self) >= self.limit:
            victim = self._victim()
            if victim is None:
                return False
            self.closed(victim)
            victim.force_close()
            self.closed_idle += 1
        self._new[handler] = None
        self._spared.add(handler)  # until it is connected and then polled (connected())
        return True

    def _victim(self) -> RequestHandler | None:
        # The spared are the newest in their line, so each scan stops at once unless a burst fills the pool.
        for line in (self._new, self._kept):
            for handler in line:
                if handler not in self._spared:
                    return handler
        return next(iter(self._new or self._kept), None)

    def _spare_until_polled(self, handler: RequestHandler) -> None:
        # A callback scheduled now runs before the loop's next poll; one it schedules runs after that poll
        # has delivered the socket's bytes (asyncio runs callbacks in order, polling between rounds).
        self._spared.add(handler)
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._spared.discard, handler)

    def connected(self, handler: RequestHandler) -> bool:
        """Its transport is reading; False when it was closed to make room before that."""
        if handler not in self._new:
            return False
        self._spare_until_polled(handler)
        return True

    def heard(self, handler: RequestHandler) -> None:
        for line in (self._new, self._kept):
            if handler in line:
                line.move_to_end(handler)

    def busy(self, handler: RequestHandler) -> None:
        if handler in self._busy:
            self._busy[handler] += 1
        elif handler in self._new or handler in self._kept:  # else closed already: nothing to track
            self.closed(handler)
            self._busy[handler] = 1

    def done(self, handler: RequestHandler) -> None:
        count = self._busy.get(handler)
        if count == 1:
            del self._busy[handler]
            self._kept[handler] = None
            self._spare_until_polled(handler)  # a keep-alive client sends its next request at once
        elif count is not None:
            self._busy[handler] = count - 1

    def closed(self, handler: RequestHandler) -> None:
        self._new.pop(handler, None)
        self._kept.pop(handler, None)
        self._busy.pop(handler, None)
        self._spared.discard(handler)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable]):
        """Marks the connection busy until its response has been written (the request's task ends)."""
        protocol = request.protocol
        self.busy(protocol)
        task = asyncio.current_task()
        if task is None:  # not run as aiohttp runs handlers: busy for the handler's time only
            try:
                return await handler(request)
            finally:
                self.done(protocol)
        task.add_done_callback(lambda _: self.done(protocol))
        return await handler(request)


class Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, telling the pool what it hears and when it closes."""

    __slots__ = ("_handler", "_live", "_pool")

    def __init__(self, handler: RequestHandler, pool: ConnectionPool) -> None:
        self._handler, self._pool = handler, pool
        self._live = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._pool.connected(self._handler):  # aiohttp would leave it open, unread, for ever
            transport.close()
            return
        self._live = True
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._pool.heard(self._handler)
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._pool.closed(self._handler)
        if self._live:
            self._handler.connection_lost(exc)
