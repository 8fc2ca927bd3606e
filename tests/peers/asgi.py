"""The raw-ASGI plumbing the hand-written test peers share: the lifespan dance, reading a request body, a JSON
answer, and serving an app on a loopback port with hypercorn's trio worker."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


async def lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge startup, then shutdown, and return (the server is stopping)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def send_json(send: Send, status: int, doc: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *(extra or [])]})
    await send({"type": "http.response.body", "body": json.dumps(doc).encode()})


@asynccontextmanager
async def serve_loopback(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) until the block ends; yields its origin ``http://127.0.0.1:PORT``."""
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config))
        yield "http://127.0.0.1:" + binds[0].rsplit(":", 1)[1]
        nursery.cancel_scope.cancel()
