"""agentd.transport.sse_response through the real server: the stream opens at once, keepalive comments flow
while the body waits, ``ends_on`` ends it with a complete response, and a client that goes away cancels the
body and runs ``closed``."""

from __future__ import annotations

import httpx
import trio

from agentd.mcp.sse import SseDecoder
from agentd.transport.asgi import Receive, Scope, Send
from agentd.transport.mounts import Mount, Mounts
from agentd.transport.sse_response import KEEPALIVE, sse_response
from tests.transport.served import served


class Stream:
    """One SSE app: an event, then keepalives until ``end`` (or the client leaves)."""

    def __init__(self) -> None:
        self.end = trio.Event()
        self.closed = trio.Event()
        self.cancelled = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with sse_response(send, receive, keepalive=0.01, ends_on=self.end, headers=(("x-extra", "1"),),
                                closed=self.closed.set) as sse:
            await sse.send(b"data: first\n\n")
            try:
                await sse.wait(trio.sleep_forever)
            except trio.Cancelled:
                self.cancelled = True
                raise


async def test_keepalives_flow_then_ends_on_ends_it_whole() -> None:
    stream = Stream()
    async with served(Mounts(http=[Mount("/s", stream)])) as s, httpx.AsyncClient() as client:
        async with client.stream("GET", f"http://127.0.0.1:{s.port}/s") as response:
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["cache-control"] == "no-cache" and response.headers["x-extra"] == "1"
            body = b""
            with trio.fail_after(10):
                async for chunk in response.aiter_raw():
                    body += chunk
                    if body.count(KEEPALIVE) >= 2 and not stream.end.is_set():
                        stream.end.set()
            # the loop ended: the response was complete (a cut one would raise)
        assert [e.data for e in SseDecoder().feed(body) if e.data] == ["first"]
        assert stream.closed.is_set() and stream.cancelled


async def test_a_client_that_leaves_cancels_the_body_and_runs_closed() -> None:
    stream = Stream()
    async with served(Mounts(http=[Mount("/s", stream)])) as s:
        async with await trio.open_tcp_stream("127.0.0.1", s.port) as sock:
            await sock.send_all(b"GET /s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            with trio.fail_after(10):
                while b"first" not in got:
                    got += await sock.receive_some(65536)
        with trio.fail_after(10):
            await stream.closed.wait()
        assert stream.cancelled and not stream.end.is_set()
