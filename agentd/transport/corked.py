"""One write per HTTP/1.1 request: httpcore's connections, with what they write held until they read.

httpcore sends a request's head and its body as two writes. Each write is a ``send`` syscall, a trio
scheduling round and, with ``TCP_NODELAY`` (trio's default), its own TCP segment, which wakes the server
twice: once for a head it cannot act on, once for the body. Every agentd request is an HTTP/1.1 exchange
that writes and then reads the response, so the network streams here hold what is written and send it at
the first read (or once ``FLUSH_AT`` bytes are held, so a large body is never copied whole): the head and
a short body leave in one write and one segment.

agentd's network backend wraps every connection it opens in one (agentd.transport.http_client); everything
else is the wrapped stream's own (TLS, ``is_readable`` for the pool's idle checks).
"""

from __future__ import annotations

from typing import Any, Final

import httpcore

#: Bytes held before they are written without waiting for the read (a large body goes out as it comes).
FLUSH_AT: Final = 64 * 1024


class CorkedStream(httpcore.AsyncNetworkStream):
    """A network stream whose writes are sent together at the next read."""

    __slots__ = ("_held", "_inner", "_size")

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held: list[bytes] = []
        self._size = 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._size += len(buffer)
        if self._size >= FLUSH_AT:
            await self._flush(timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            await self._flush(timeout)
        return await self._inner.read(max_bytes, timeout)

    async def _flush(self, timeout: float | None) -> None:
        held = self._held
        data = held[0] if len(held) == 1 else b"".join(held)
        self._held, self._size = [], 0
        await self._inner.write(data, timeout)

    async def aclose(self) -> None:
        self._held, self._size = [], 0  # a request abandoned before its read: nothing of it is sent
        await self._inner.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        if self._held:  # a proxy's CONNECT is always read before TLS starts; flushed all the same
            await self._flush(timeout)
        return CorkedStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)
