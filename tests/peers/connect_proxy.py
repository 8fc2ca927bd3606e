"""A tiny HTTP CONNECT proxy on loopback, for the tests of ``HTTPS_PROXY``.

Whatever host a ``CONNECT host:port`` names, the tunnel goes to ``127.0.0.1:port``: a test can address a
non-loopback-looking name (which agentd must proxy) while every byte stays on this machine. Each CONNECT's
target is recorded so a test can tell what went through the proxy and what did not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

MAX_HEAD = 16 * 1024


@attrs.define
class ConnectProxy:
    url: str
    #: ``host:port`` of every CONNECT received, in order.
    tunnels: list[str] = attrs.field(factory=list)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def _handle(proxy: ConnectProxy, client: trio.SocketStream) -> None:
    async with client:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await client.receive_some(4096)
            if not chunk or len(head) > MAX_HEAD:
                return
            head += chunk
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, target, _ = [*request_line.split(" "), "", ""][:3]
        if method != "CONNECT" or ":" not in target:
            await client.send_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            return
        proxy.tunnels.append(target)
        port = int(target.rsplit(":", 1)[1])
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await client.send_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        async with upstream:
            await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
            if rest:
                await upstream.send_all(rest)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, upstream)
                nursery.start_soon(_pipe, upstream, client)


@asynccontextmanager
async def connect_proxy() -> AsyncIterator[ConnectProxy]:
    """Serve a CONNECT proxy on 127.0.0.1 for the duration of the block."""
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        proxy = ConnectProxy(f"http://127.0.0.1:{port}")

        async def handler(stream: trio.SocketStream) -> None:
            await _handle(proxy, stream)

        nursery.start_soon(trio.serve_listeners, handler, listeners)
        yield proxy
        nursery.cancel_scope.cancel()
