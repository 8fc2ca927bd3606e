"""The ASGI vocabulary the listener's mounted apps share: a request's headers, a sized reply, a bounded body read.

Every app of the served surface (agentd.transport.asgi_server's table) answers through these, so a reply is
the same bytes whichever app made it, and a body is read with one rule: at most ``limit`` bytes
(:class:`TooLarge`), within ``timeout`` seconds (``trio.TooSlowError``), and what already arrived is taken
without a checkpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from agentd.mcp.server_session import HttpReply

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: How much of an oversized body is read and thrown away before the 413, so the connection closes with
#: nothing unread: closing a socket with unread data sends a TCP reset, which makes the peer's kernel drop
#: the 413 it had already received ("server disconnected"). Past this the peer may see a reset instead.
DISCARD_MAX: Final = 4 * 1024 * 1024
DISCARD_TIME: Final = 2.0

NOT_FOUND: Final = HttpReply(404, b"not found", "text/plain")


class TooLarge(Exception):
    """A request body past its limit (declared or read)."""


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name; a repeated header's values joined with ``, ``."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        if name in out:
            out[name] = f"{out[name]}, {raw_value.decode('latin-1')}"
        else:
            out[name] = raw_value.decode("latin-1")
    return out


async def send_reply(send: Send, reply: HttpReply) -> None:
    """A whole response with its ``Content-Length``."""
    headers: list[tuple[bytes, bytes]] = []
    if reply.content_type is not None:
        headers.append((b"content-type", reply.content_type.encode()))
    headers.append((b"content-length", str(len(reply.body)).encode()))
    headers.extend((k.encode(), v.encode()) for k, v in reply.headers)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """The app of every path nothing is mounted on."""
    await send_reply(send, NOT_FOUND)


async def read_body(headers: Mapping[str, str], receive: Receive, *, limit: int, timeout: float) -> bytes:
    """The request body: :class:`TooLarge` past ``limit`` bytes, ``trio.TooSlowError`` past ``timeout`` seconds."""
    length = headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else None
    if declared is not None and declared > limit:
        raise TooLarge
    chunks: list[bytes] = []
    size = 0

    def complete(message: Mapping[str, Any]) -> bool:
        """Take one ASGI message; True once the body is whole (or the request is over)."""
        nonlocal size
        if message["type"] != "http.request":
            return True
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        # the declared length is all there is (the HTTP layer enforces it): no wait for the end
        return not message.get("more_body", False) or size == declared

    # agentd's server's ``receive`` (like a memory channel's) has a ``receive_nowait``: what already arrived
    # (a small body comes with its request) is taken without a timeout scope or a checkpoint; the timed loop
    # waits for the rest.
    take = getattr(getattr(receive, "__self__", None), "receive_nowait", None)
    done = False
    if take is not None:
        try:
            while not done:
                done = complete(take())
        except trio.WouldBlock:
            pass
    if not done:
        # A bare CancelScope: fail_after's context-manager wrapper is measurable on the hot path.
        with trio.CancelScope(deadline=trio.current_time() + timeout) as scope:
            while not done:
                done = complete(await receive())
        if scope.cancelled_caught:
            raise trio.TooSlowError
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def discard_body(headers: Mapping[str, str], receive: Receive) -> None:
    """Read the rest of a refused body, bounded in bytes and time; a body declared larger is not read."""
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > DISCARD_MAX:
        return
    seen = 0
    with trio.move_on_after(DISCARD_TIME):
        while seen <= DISCARD_MAX:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` when the peer goes away (what else arrives is dropped)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def cancel_on_event(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


__all__ = ["DISCARD_MAX", "DISCARD_TIME", "App", "Receive", "Scope", "Send", "TooLarge", "cancel_on_disconnect",
           "cancel_on_event", "discard_body", "not_found", "read_body", "request_headers", "send_reply"]
