"""httpx's transport interface over an httpcore connection pool that agentd builds itself.

agentd's network backend (the egress check on every connected socket, one write per request) is passed to
httpcore's pool the documented way, ``AsyncConnectionPool(network_backend=...)``; httpx's own
``AsyncHTTPTransport`` builds its pool with no way to pass one. So the pool is agentd's, and this module is the
small adapter httpx documents for custom transports (``AsyncBaseTransport.handle_async_request``): an httpx
request becomes an httpcore request, the response comes back as an httpx response, and httpcore's exceptions
become httpx's, most specific first, as httpx's own transport maps them.

A transport can let go of its connections once all of them are idle (:meth:`PoolTransport.release_idle`):
httpcore closes a connection whose keep-alive expired only when its pool is next used, and a closed one stays in
the pool (its objects with it) until then, so the pool is closed and dropped; the next request builds a fresh one.

The response body is an explicit async iterator rather than an async generator: it has no frame for a
garbage collector to finalise when a caller stops reading early, and its :meth:`aclose` is always awaited
by httpx when the response is closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Final

import httpcore
import httpx

#: httpcore's exception -> httpx's, most specific first (the first ``isinstance`` match wins).
_MAPPED: Final[tuple[tuple[type[Exception], type[httpx.HTTPError]], ...]] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextmanager
def mapped() -> Iterator[None]:
    """Raise httpcore's failures as httpx's (the original as the cause), everything else unchanged."""
    try:
        yield
    except Exception as exc:
        for source, target in _MAPPED:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


class _Body(httpx.AsyncByteStream):
    """A response body read from httpcore's stream, its failures mapped."""

    __slots__ = ("_chunks", "_stream")

    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream
        self._chunks: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            self._chunks = self._stream.__aiter__()
        with mapped():
            return await self._chunks.__anext__()

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            with mapped():
                await close()


#: An httpcore pool, direct or through a proxy (``AsyncHTTPProxy`` is a connection pool).
Pool = httpcore.AsyncConnectionPool | httpcore.AsyncHTTPProxy


class PoolTransport(httpx.AsyncBaseTransport):
    """One httpcore pool (direct or through a proxy) as an httpx transport; ``new`` builds it (at once, so a bad
    setting fails here) and, after :meth:`release_idle`, its successor (at the next request)."""

    __slots__ = ("_new", "_pool")

    def __init__(self, new: Callable[[], Pool]) -> None:
        self._new = new
        self._pool: Pool | None = new()

    async def release_idle(self) -> bool:
        """Close every connection when each one is idle (none carries a request or a response being read), and
        drop the pool: the next request builds a fresh one. True when there were any. The caller bounds and
        shields it."""
        pool = self._pool
        connections = [] if pool is None else pool.connections
        if pool is None or not connections or not all(connection.is_idle() for connection in connections):
            return False
        self._pool = None
        await pool.aclose()
        return True

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        pool = self._pool
        if pool is None:
            pool = self._pool = self._new()
        with mapped():
            response = await pool.handle_async_request(core)
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
