"""One SSE response of the MCP endpoint: start it, send events with keepalives between them, end it.

All three of the endpoint's streams (a legacy session's GET stream, a modern ``subscriptions/listen`` stream, a
long request answered as SSE) share this skeleton. A client disconnect (and an ``ends_on`` event, when set)
cancels the body; whatever ends it, ``closed`` runs, then the response body is ended (shielded, bounded).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import attrs
import trio

from agentd.mcp.sse import encode_comment
from agentd.mcp.streamable_http import EVENT_STREAM
from agentd.transport.asgi import Receive, Send, cancel_on_disconnect, cancel_on_event

KEEPALIVE: Final = encode_comment("keepalive")
#: How long the end of a stream may take once it is over (the peer may be gone).
END_TIME: Final = 1.0
_T = TypeVar("_T")


@attrs.define(eq=False)
class SseStream:
    """The open body of one SSE response; ``nursery`` is cancelled when the stream ends."""

    _send: Send
    keepalive: float
    nursery: trio.Nursery

    async def send(self, data: bytes) -> None:
        await _body(self._send, data)

    async def wait(self, source: Callable[[], Awaitable[_T]]) -> _T:
        """``await source()`` (which must be safe to cancel and call again), sending a ``: keepalive``
        comment each time ``keepalive`` seconds pass without an answer."""
        while True:
            with trio.move_on_after(self.keepalive):
                return await source()
            await _body(self._send, KEEPALIVE)


@asynccontextmanager
async def sse_response(send: Send, receive: Receive, *, keepalive: float, headers: tuple[tuple[str, str], ...] = (),
                       ends_on: trio.Event | None = None,
                       closed: Callable[[], None] | None = None) -> AsyncIterator[SseStream]:
    """One SSE response: start it, let the body send events (:class:`SseStream`), then end it.

    A client disconnect (and ``ends_on``, when set) cancels the body. ``closed`` runs however the
    stream ends, before the response body is ended (shielded, bounded) on a normal or cancelled end.
    """
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
            if ends_on is not None:
                nursery.start_soon(cancel_on_event, ends_on, nursery.cancel_scope)
            await send(_start(headers))
            yield SseStream(send, keepalive, nursery)
            nursery.cancel_scope.cancel()
    finally:
        if closed is not None:
            closed()
    with trio.move_on_after(END_TIME) as cleanup:
        cleanup.shield = True
        await _end_body(send)


def _start(extra: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    headers = [(b"content-type", EVENT_STREAM.encode()), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]
    headers.extend((k.encode(), v.encode()) for k, v in extra)
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _end_body(send: Send) -> None:
    try:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception:  # the peer is gone; nothing left to tell it
        pass


__all__ = ["KEEPALIVE", "SseStream", "sse_response"]
