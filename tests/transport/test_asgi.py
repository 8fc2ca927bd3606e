"""agentd.transport.asgi through the real server: a body read is bounded in bytes (declared or sent) and in
time, a refused body is read away so the 413 arrives (not a reset), repeated headers are joined, and a reply
carries its length."""

from __future__ import annotations

import httpx
import trio

from agentd.mcp.server_session import HttpReply
from agentd.transport.asgi import (
    Receive,
    Scope,
    Send,
    TooLarge,
    discard_body,
    read_body,
    request_headers,
    send_reply,
)
from agentd.transport.mounts import Mount, Mounts
from tests.transport.served import served


async def reader(scope: Scope, receive: Receive, send: Send) -> None:
    headers = request_headers(scope)
    try:
        body = await read_body(headers, receive, limit=100, timeout=0.2)
    except TooLarge:
        await discard_body(headers, receive)
        await send_reply(send, HttpReply(413, b"too large", "text/plain"))
        return
    except trio.TooSlowError:
        await send_reply(send, HttpReply(408, b"too slow", "text/plain"))
        return
    await send_reply(send, HttpReply(200, b"%d bytes; x=%s" % (len(body), headers.get("x", "").encode()),
                                     "text/plain", headers=(("x-seen", "yes"),)))


def table() -> Mounts:
    return Mounts(http=[Mount("/read", reader)])


async def test_sizes_declared_and_sent() -> None:
    async with served(table()) as s, httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as client:
        ok = await client.post("/read", content=b"a" * 100, headers=[("x", "1"), ("x", "2")])
        assert (ok.status_code, ok.text, ok.headers["x-seen"]) == (200, "100 bytes; x=1, 2", "yes")
        assert ok.headers["content-length"] == str(len(ok.content))
        assert (await client.post("/read", content=b"a" * 101)).status_code == 413

        async def chunked() -> object:
            for _ in range(30):
                yield b"aaaaa"

        sent = await client.post("/read", content=chunked())  # no Content-Length: counted as it comes
        assert sent.status_code == 413


async def test_a_body_that_stops_coming_is_too_slow() -> None:
    async with served(table()) as s, await trio.open_tcp_stream("127.0.0.1", s.port) as sock:
        await sock.send_all(b"POST /read HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\nabc")
        got = b""
        with trio.fail_after(10):
            while b"too slow" not in got:
                got += await sock.receive_some(65536)
        assert got.startswith(b"HTTP/1.1 408 ")
