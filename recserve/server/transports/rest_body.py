"""REST request bodies read and inflated under the worker's memory budget, never by aiohttp.

aiohttp would buffer a body and inflate a ``Content-Encoding: gzip`` one as it arrives, with no bound but the
size of the compressed bytes: a 61 KB body can hold 60 MB before its handler runs, and a client that then
stalls keeps it until the read timeout. Here the wire bytes are read chunk by chunk, each chunk reserved from
the :class:`~recserve.server.transports.budget.MemoryBudget` before it is kept, and a compressed body is
inflated only once all of it has arrived (a stalled upload holds its compressed bytes, not what they expand
to), in steps of at most :data:`INFLATE_STEP` bytes that are reserved as they come out and counted against the
message size limit, so no step can inflate past it.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from recserve.errors import InvalidRequestError, RecServeError
from recserve.server.transports.budget import Reservation

INFLATE_STEP = 1 << 20
_GZIP = 16 + zlib.MAX_WBITS
_WBITS = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": zlib.MAX_WBITS}
_LIMIT = "the server takes at most {} bytes per message (--max-message-mb)"


class BodyTooLarge(RecServeError):
    """A body over the message size limit, on the wire or once inflated (HTTP 413)."""


def content_coding(request: web.Request) -> str:
    """The body's ``Content-Encoding`` ("" for identity); unknown codings are refused before any read."""
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding in ("", "identity"):
        return ""
    if coding not in _WBITS:
        raise InvalidRequestError(
            f"Content-Encoding: {coding[:40]!r} is not supported; send the body as gzip, deflate or identity"
        )
    return coding


async def read_body(request: web.Request, reservation: Reservation, max_bytes: int) -> bytes:
    """The whole body, inflated; its bytes are held in ``reservation`` (grown as they arrive).

    Raises :class:`BodyTooLarge`, :class:`~recserve.server.transports.budget.BudgetExhausted`, or
    ``InvalidRequestError`` for a body that does not decode under its ``Content-Encoding``.
    """
    coding = content_coding(request)
    length = request.content_length
    if length is not None and length > max_bytes:
        raise BodyTooLarge(f"Content-Length: {length} bytes; {_LIMIT.format(max_bytes)}")
    parts, size = [], 0
    try:
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"request body: more than {max_bytes} bytes; {_LIMIT.format(max_bytes)}")
            reservation.grow(len(chunk))
            parts.append(chunk)
    except RequestPayloadError as exc:  # chunked framing the parser could not follow
        raise InvalidRequestError(f"request body: {exc}") from None
    body = _joined(parts, reservation)
    if not coding:
        return body
    inflated = await _inflate(body, coding, reservation, max_bytes)
    reservation.resize(reservation.nbytes - len(body))
    return inflated


async def _inflate(data: bytes, coding: str, reservation: Reservation, max_bytes: int) -> bytes:
    """``data`` inflated in steps of at most :data:`INFLATE_STEP` bytes, each reserved before the next."""
    wbits = _WBITS[coding]
    if coding == "deflate" and data and data[0] & 0x0F != 8:  # raw deflate, as many clients send it
        wbits = -zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    parts, size, pending = [], 0, data
    try:
        while True:
            # One byte past the limit at most: enough to tell that the body is over it.
            out = inflater.decompress(pending, min(INFLATE_STEP, max_bytes - size + 1))
            size += len(out)
            if size > max_bytes:
                raise BodyTooLarge(
                    f"Content-Encoding: {coding}: the body inflates to more than {max_bytes} bytes; "
                    + _LIMIT.format(max_bytes)
                )
            reservation.grow(len(out))
            parts.append(out)
            pending = inflater.unconsumed_tail
            if inflater.eof and inflater.unused_data and wbits == _GZIP:  # the next gzip member
                pending, inflater = inflater.unused_data, zlib.decompressobj(wbits)
            elif inflater.eof or not (pending or out):
                break
            await asyncio.sleep(0)  # a large body takes a while: let the loop serve others between steps
    except zlib.error as exc:
        raise _undecodable(coding, str(exc)) from None
    if not inflater.eof:
        raise _undecodable(coding, "the body ends before the compressed stream does")
    if inflater.unused_data:
        extra = len(inflater.unused_data)
        raise _undecodable(coding, f"{extra} bytes after the end of the compressed stream")
    return _joined(parts, reservation)


def _joined(parts: list[bytes], reservation: Reservation) -> bytes:
    """The parts as one ``bytes``; the copy is reserved while both exist."""
    if len(parts) == 1:
        return parts.pop()
    size = sum(map(len, parts))
    reservation.grow(size)
    body = b"".join(parts)
    parts.clear()
    reservation.resize(reservation.nbytes - size)
    return body


def _undecodable(coding: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"Content-Encoding: {coding}: the request body is not {coding} data ({why})")
