"""A thin httpx adapter for the Streamable HTTP client: one request in, a reply of JSON-RPC messages out.

Everything protocol-shaped lives in :mod:`agentd.mcp` (headers, statuses, SSE framing); this module
only moves bytes and maps httpx's failures to :mod:`agentd.errors` at the edge. Redirects are never
followed, bodies and SSE events are size-capped, and no timeout lives here: deadlines are trio scopes
owned by the caller (httpx runs with ``timeout=None``).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import httpcore
import httpx
import trio

from agentd import defaults
from agentd.errors import ConfigError, McpProtocolError, McpTransportError
from agentd.mcp import jsonrpc
from agentd.mcp.sse import SseDecoder, SseError
from agentd.mcp.streamable_http import Body, classify
from agentd.transport.corked import CorkedStream
from agentd.transport.egress import EgressPolicy, classify_address
from agentd.transport.pool_transport import PoolTransport
from agentd.transport.proxy import ProxyEnv
from agentd.transport.tls import client_context, default_context
from agentd.transport.tls_errors import verify_hint

DEFAULT_MAX_BODY: Final = defaults.MAX_BODY
#: How long closing a response may take when the caller is being cancelled.
CLOSE_GRACE: Final = 2.0


def display_url(url: str) -> str:
    """The URL without userinfo or query, for messages and logs (either may carry a credential)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class ConnectionLost(McpTransportError):
    """The connection itself failed (refused, reset, closed mid-response): the peer may be gone."""


def _cert_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind ``exc`` (httpx and trio wrap it, sometimes wordlessly)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_error(exc: httpx.HTTPError) -> str:
    """An httpx failure in a line: its kind, its detail, and for a certificate failure what it means."""
    return _describe(exc)


def _describe(exc: httpx.HTTPError) -> str:
    detail = str(exc).strip()
    name = exc.__class__.__name__
    failure = _cert_failure(exc)
    if failure is not None and not detail:
        detail = f"certificate verify failed: {failure.verify_message}"
    described = f"{name}: {detail}" if detail else name
    if failure is not None:
        described += f" ({verify_hint(failure)})"
    return described


def _http_transport(policy: EgressPolicy, verify: ssl.SSLContext, limits: httpx.Limits,
                    proxy: str | None = None) -> PoolTransport:
    """An httpcore pool (through ``proxy`` when one is named) on agentd's network backend (:class:`_Backend`),
    behind httpx's transport interface."""
    backend = _Backend(httpcore.TrioBackend(), policy, proxied=proxy is not None)
    sizes: dict[str, Any] = {
        "ssl_context": verify, "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections, "keepalive_expiry": limits.keepalive_expiry,
        "http1": True, "http2": False, "network_backend": backend,
    }
    if proxy is None:
        return PoolTransport(functools.partial(httpcore.AsyncConnectionPool, **sizes))
    via = httpx.Proxy(proxy)
    if via.url.scheme not in ("http", "https"):
        raise ValueError(via.url.scheme)
    return PoolTransport(functools.partial(
        httpcore.AsyncHTTPProxy,
        proxy_url=httpcore.URL(scheme=via.url.raw_scheme, host=via.url.raw_host, port=via.url.port,
                               target=via.url.raw_path),
        proxy_auth=via.raw_auth, proxy_headers=via.headers.raw, **sizes,
    ))


class _Routed(httpx.AsyncBaseTransport):
    """Each request direct or through the proxy :class:`ProxyEnv` names for its URL (loopback: always direct)."""

    def __init__(self, proxies: ProxyEnv, verify: ssl.SSLContext, limits: httpx.Limits, policy: EgressPolicy) -> None:
        self._proxies = proxies
        self._verify = verify
        self._limits = limits
        self._direct = _http_transport(policy, verify, limits)
        # Built now, so a bad proxy setting is a configuration error before any request, not a crash in one.
        self._via: dict[str, PoolTransport] = {}
        for proxy in {p for p in (proxies.https, proxies.http) if p}:
            try:
                self._via[proxy] = _http_transport(policy, verify, limits, proxy)
            except (ValueError, httpx.InvalidURL):  # httpx's message may repeat the URL's credentials: not shown
                raise ConfigError(
                    f"proxy {display_url(proxy)} (HTTPS_PROXY/HTTP_PROXY/ALL_PROXY): agentd supports http:// and "
                    "https:// proxies"
                ) from None

    def _transport(self, url: str) -> PoolTransport:
        proxy = self._proxies.proxy_for(url)
        return self._direct if proxy is None else self._via[proxy]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport(str(request.url)).handle_async_request(request)

    async def release_idle(self) -> bool:
        released = False
        for transport in (self._direct, *self._via.values()):
            released = await transport.release_idle() or released
        return released

    async def aclose(self) -> None:
        for transport in (self._direct, *self._via.values()):
            await transport.aclose()


class MetadataRefused(httpcore.ConnectError):
    """A connection landed on an address the egress rule refuses: a link-local/cloud metadata address, or (a
    direct connection, not one to a proxy) a private or other non-global one, that ``egress.allow`` does not name.

    Raised inside httpcore, so callers see an :class:`httpx.ConnectError` whose cause is this; it is never
    worth a retry (the same name resolves to the same place)."""


class _Backend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend as agentd uses it: every TCP connection is refused if it lands on a link-local/
    cloud metadata address, or on a private or other non-global address (loopback is allowed), unless
    ``egress.allow`` names it; and every stream writes a request in one piece
    (:class:`~agentd.transport.corked.CorkedStream`).

    The address is checked on the connected socket itself: a DNS name that resolves there
    (``metadata.google.internal``, a rebinding record, a typo) is caught the same as an address literal, and
    before a byte is sent. :class:`MetadataRefused` is an httpcore connect error, so callers see the ordinary
    :class:`httpx.ConnectError` (with it as the cause). A proxy's own address is the operator's setting
    (``HTTPS_PROXY``): a ``proxied`` backend holds it to the metadata rule only.
    """

    __slots__ = ("_inner", "_policy", "_proxied")

    def __init__(self, inner: httpcore.AsyncNetworkBackend, policy: EgressPolicy, *, proxied: bool = False) -> None:
        self._inner = inner
        self._policy = policy
        self._proxied = proxied

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        refusal = refused_peer(stream.get_extra_info("server_addr"), self._policy, proxied=self._proxied)
        if refusal is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise MetadataRefused(refusal)
        return CorkedStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return CorkedStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def refused_peer(peer: object, policy: EgressPolicy, *, proxied: bool = False) -> str | None:
    """Why a connection to ``peer`` (a socket address) is refused, as a message; None when it may go on."""
    if not isinstance(peer, tuple) or not peer:
        return None
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return None
    reason = classify_address(address, policy, loopback_ok=True)
    if reason == "metadata":
        return (f"refused to connect to {address}: a link-local/cloud metadata address "
                "(list it in the config file's egress.allow to use it)")
    if reason is not None and not proxied:
        return (f"refused to connect to {address}: a private or non-public address (egress there is opt-in: "
                "name it in the config file's egress: {allow: [CIDR]})")
    return None


class Client(httpx.AsyncClient):
    """httpx's client over agentd's transport (:func:`new_client`), which can let go of its idle connections."""

    def __init__(self, transport: PoolTransport | _Routed, **options: Any) -> None:
        super().__init__(transport=transport, **options)
        self._pools = transport

    async def release_idle(self) -> bool:
        """Close the client's kept-alive connections if none is in use (the next request connects anew); True
        when there were any. Bound and shield it at the caller (closing a TLS connection writes to it)."""
        return await self._pools.release_idle()


def new_client(
    verify: ssl.SSLContext | bool = True,
    *,
    limits: httpx.Limits | None = None,
    environ: dict[str, str] | None = None,
    egress: EgressPolicy | None = None,
) -> Client:
    """The httpx client agentd uses: no redirects, no httpx timeouts, proxies from the environment.

    ``verify=True`` means the process's cached default context (:mod:`agentd.transport.tls`), not a fresh
    load of the CA bundle per client. ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` and ``NO_PROXY`` are read
    (from ``environ``, default ``os.environ``) when the client is built; loopback is never proxied
    (:mod:`agentd.transport.proxy`). httpx's own ``trust_env`` stays off (no ``.netrc``).

    Every connection is refused if it lands on a link-local/cloud metadata address, or a private or other
    non-global one (loopback is allowed), that ``egress`` (the config file's ``egress.allow``; default: nothing
    allowed) does not name, whatever the URL's host said.
    """
    context = default_context() if verify is True else verify if verify is not False else _unverified()
    if limits is None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    proxies = ProxyEnv.from_environ(os.environ if environ is None else environ)
    policy = EgressPolicy() if egress is None else egress
    transport: PoolTransport | _Routed
    if proxies.active:
        transport = _Routed(proxies, context, limits, policy)
    else:
        transport = _http_transport(policy, context, limits)
    return Client(
        transport,
        verify=context,
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(None),
        limits=limits,
    )


def _unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """A client TLS context: a private CA bundle and/or a client certificate for mTLS (cached per files)."""
    return client_context(ca, cert, key)


@attrs.define(eq=False)
class HttpReply:
    """One HTTP response being read. :meth:`receive` pulls the next JSON-RPC message, JSON or SSE alike."""

    method: str
    url: str
    status: int
    headers: httpx.Headers
    kind: Body
    server: str | None
    _response: httpx.Response
    _max_body: int
    decoder: SseDecoder
    _chunks: AsyncIterator[bytes] | None = None
    _queue: list[jsonrpc.Message] = attrs.field(factory=list)
    _done: bool = False

    @property
    def last_event_id(self) -> str | None:
        return self.decoder.last_event_id

    @property
    def retry_ms(self) -> int | None:
        return self.decoder.retry_ms

    def header(self, name: str) -> str | None:
        value: str | None = self.headers.get(name)
        return value

    async def read_body(self) -> bytes:
        """The whole body, refusing one larger than the cap instead of buffering it."""
        declared = self.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self._max_body:
            raise self._protocol(f"a {int(declared)}-byte body exceeds the {self._max_body}-byte limit")
        body = bytearray()
        while (chunk := await self._next_chunk()) is not None:
            body += chunk
            if len(body) > self._max_body:
                raise self._protocol(f"the body exceeds the {self._max_body}-byte limit")
        return bytes(body)

    async def error_body(self) -> jsonrpc.ErrorResponse | None:
        """A JSON-RPC error carried by a non-2xx response (modern servers put their verdict there)."""
        try:
            body = await self.read_body()
            message = jsonrpc.parse_message(jsonrpc.loads(body, "replace"))
        except (McpProtocolError, McpTransportError, ValueError, jsonrpc.InvalidMessage):
            return None
        return message if isinstance(message, jsonrpc.ErrorResponse) else None

    async def receive(self) -> jsonrpc.Message | None:
        """The next message, or None when the body or stream has ended."""
        while not self._queue:
            if self._done:
                return None
            if self.kind is Body.JSON:
                self._done = True
                self._queue.extend(self._parse(await self.read_body()))
                continue
            chunk = await self._next_chunk()
            if chunk is None:
                self._done = True
                return None
            try:
                events = self.decoder.feed(chunk)
            except SseError as exc:
                raise self._protocol(f"broken event stream: {exc}") from None
            for event in events:
                if event.data.strip():  # priming events carry only an id and/or retry
                    # A 2025-03-26 server may put a JSON-RPC batch in one event.
                    self._queue.extend(self._parse(event.data.encode()))
        return self._queue.pop(0)

    def truncated(self) -> bool:
        return self.kind is Body.SSE and self.decoder.pending()

    async def _next_chunk(self) -> bytes | None:
        if self._chunks is None:
            self._chunks = self._response.aiter_bytes().__aiter__()
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        except httpx.HTTPError as exc:
            raise ConnectionLost(
                f"{self.method} {display_url(self.url)}: the response broke ({_describe(exc)})", server=self.server
            ) from None

    def _parse(self, data: bytes) -> list[jsonrpc.Message]:
        """One message, or a batch (2025-03-26 allowed them, in a body or in one event)."""
        try:
            parsed = jsonrpc.parse_body(data, "replace")
        except jsonrpc.InvalidMessage as exc:
            raise self._protocol(f"not a JSON-RPC message ({exc})") from None
        return parsed if isinstance(parsed, list) else [parsed]

    def _protocol(self, what: str) -> McpProtocolError:
        return McpProtocolError(f"{self.method} {display_url(self.url)}: {what}", server=self.server)


@attrs.define(eq=False)
class HttpTransport:
    """Requests to one endpoint over a (possibly shared) httpx client."""

    client: httpx.AsyncClient
    url: str
    server: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    #: Parsed once: httpx would re-parse the string on every request.
    _target: httpx.URL = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._target = httpx.URL(self.url)
    #: An ``httpx.Auth`` consulted on every request (credentials, 401 -> refresh -> retry once), or None.
    auth: httpx.Auth | None = None

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    @asynccontextmanager
    async def open(
        self, method: str, headers: dict[str, str], body: bytes | None = None, *, had_session: bool = False
    ) -> AsyncIterator[HttpReply]:
        """Send one request and yield its reply; the response is closed (shielded, bounded) on exit."""
        request = self.client.build_request(method, self._target, headers=headers, content=body)
        try:
            if self.auth is not None:
                response = await self.client.send(request, stream=True, auth=self.auth)
            else:
                response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            # Refused or never connected: the request was not written, so the server cannot have acted on it.
            unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            raise ConnectionLost(f"{method} {display_url(self.url)}: {_describe(exc)}", server=self.server,
                                 unsent=unsent) from None
        try:
            kind = classify(response.status_code, response.headers.get("content-type"), method=method,
                            had_session=had_session)  # fmt: skip
            if kind is Body.REDIRECT:
                target = display_url(urllib.parse.urljoin(self.url, response.headers.get("location", "")))
                raise McpTransportError(
                    f"{method} {display_url(self.url)}: HTTP {response.status_code} redirect to {target} (agentd "
                    "never follows redirects; declare the final endpoint)",
                    server=self.server,
                )
            yield HttpReply(
                method, self.url, response.status_code, response.headers, kind, self.server, response,
                self.max_body, SseDecoder(self.max_body),
            )  # fmt: skip
        finally:
            with trio.move_on_after(CLOSE_GRACE, shield=True):
                await response.aclose()

    async def delete(self, headers: dict[str, str]) -> int:
        async with self.open("DELETE", headers) as reply:
            return reply.status
