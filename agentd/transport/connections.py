"""agentd's accept loop: which connections run, which idle one makes room, and that one bad connection never ends
the daemon.

Each connection runs under :meth:`Connections.handle`: whatever it raises is logged as ``serve.connection_error``
(the class name only, rate-limited), that connection is closed, and serving goes on. The loop also:

- caps open connections, in total and per client (an IPv4 address, an IPv6 /64); at the total cap a new
  connection is still admitted and the *oldest idle* connection is closed instead, whatever its client (idle: it
  has sent no complete request head yet, TLS handshake included, or it is a keep-alive connection between
  requests, or an HTTP/2 connection with no stream; a connection with a request in flight is never cut), so idle
  connections from a handful of addresses cannot keep new clients out; with no idle connection to close, and at
  the per-client cap, the new connection is refused (``serve.refused`` events, rate-limited);
- survives accept errors such as ``EMFILE`` (an event, a short pause, no traceback);
- completes the TLS handshake within the idle limit, then hands the connection to HTTP/2
  (:mod:`agentd.transport.http2`) when ALPN chose ``h2`` or, in clear with HTTP/2 enabled, the first bytes are
  the HTTP/2 preface; to HTTP/1.1 (:mod:`agentd.transport.http11`) otherwise;
- at shutdown (:meth:`Connections.drain`) closes idle connections at once and busy ones after their response.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Callable
from typing import Any, Final, cast

import attrs
import trio

from agentd.telemetry.events import EventLog
from agentd.transport.http2 import Http2
from agentd.transport.http11 import Http11
from agentd.transport.served import App, Served, Settings, address

#: Accept errors that mean "out of a resource right now": pause and retry rather than fail.
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_PAUSE: Final = 0.1
#: Rate-limited events: at most this many per second per kind; the rest are counted in the next one.
_EVENTS_PER_SECOND: Final = 5
#: How long closing a failed or refused connection may take.
_CLOSE_TIME: Final = 1.0
#: What a cleartext HTTP/2 connection starts with (RFC 9113 3.4).
H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@attrs.frozen
class ConnectionLimits:
    """Per-process connection bounds (the defaults live in ``ServeConfig``)."""

    max_connections: int
    max_per_client: int


@attrs.define(eq=False)
class Throttle:
    """At most ``per_second`` passes per second; :meth:`allow` says how many were held back since the last pass."""

    per_second: int = _EVENTS_PER_SECOND
    _window: float = -1.0
    _count: int = 0
    _held: int = 0

    def allow(self, now: float) -> int | None:
        if now - self._window >= 1.0:
            self._window, self._count = now, 0
        if self._count >= self.per_second:
            self._held += 1
            return None
        self._count += 1
        held, self._held = self._held, 0
        return held


def _peer_host(stream: trio.abc.Stream) -> str:
    inner: Any = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    try:
        peer = inner.socket.getpeername()
    except (OSError, AttributeError):
        return ""
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


def client_key(host: str) -> str:
    """What the per-client cap counts by: an IPv4 address (a v4-mapped IPv6 one as the IPv4 it carries), or an
    IPv6 address's /64 (one host is commonly handed a whole /64, so exact IPv6 addresses would not bound it)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@attrs.define(eq=False)
class Connections:
    """Admits, runs and contains every connection of one server."""

    app: App
    settings: Settings
    limits: ConnectionLimits
    log: EventLog
    open: int = 0
    per_client: dict[str, int] = attrs.field(factory=dict)
    _throttles: dict[str, Throttle] = attrs.field(factory=dict)
    _admitted: set[Served] = attrs.field(factory=set)
    _draining: bool = False

    def _event(self, kind: str, emit: Callable[..., None], name: str, **fields: Any) -> None:
        held = self._throttles.setdefault(kind, Throttle()).allow(trio.current_time())
        if held is not None:
            emit(name, **fields, **({"suppressed": held} if held else {}))

    def app_error(self, exc: BaseException) -> None:
        """The app raised while answering a request (the class name only: a message may quote the peer's bytes)."""
        self._event("app", self.log.warn, "serve.request", error=type(exc).__name__)

    def drain(self) -> None:
        """Shutdown: idle connections close now, busy ones once their response is out."""
        self._draining = True
        for served in self._admitted:
            served.close_when_idle()

    async def accept_loop(self, listener: trio.abc.Listener[Any], nursery: trio.Nursery) -> None:
        """Accept until cancelled; resource errors pause the loop instead of ending it."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _CAPACITY_ERRNOS:
                        raise
                    self._event("accept", self.log.warn, "serve.refused", reason="accept",
                                error=errno.errorcode.get(exc.errno or 0, "OSError"))
                    await trio.sleep(_ACCEPT_PAUSE)
                    continue
                nursery.start_soon(self.handle, stream)

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One connection: admitted under the caps, run, and whatever it raises stays here."""
        host = client_key(_peer_host(stream))
        try:
            if self.per_client.get(host, 0) >= self.limits.max_per_client:
                self._event("cap_client", self.log.info, "serve.refused", reason="client_connection_limit",
                            limit=self.limits.max_per_client)
                return
            at_cap = self.open >= self.limits.max_connections
            if at_cap and self.open - sum(c.evicted for c in self._admitted) >= self.limits.max_connections:
                oldest = min((c for c in self._admitted if c.idle and not c.evicted),
                             key=lambda c: c.idle_since, default=None)
                if oldest is None:  # every connection has a request in flight: none is cut
                    self._event("cap", self.log.info, "serve.refused", reason="connection_limit",
                                limit=self.limits.max_connections)
                    return
                oldest.evict()
                self._event("evict", self.log.info, "serve.evicted", reason="connection_limit",
                            limit=self.limits.max_connections)
            self.open += 1
            self.per_client[host] = self.per_client.get(host, 0) + 1
            served = Served(self.settings, trio.current_time())
            if self._draining:
                served.close_when_idle()
            self._admitted.add(served)
            try:
                await self._run(stream, served)
            except* Exception as group:
                first = group.exceptions[0]
                # the class name only: a message may quote the peer's bytes (headers, tokens)
                self._event("error", self.log.warn, "serve.connection_error", error=type(first).__name__)
            finally:
                self._admitted.discard(served)
                self.open -= 1
                left = self.per_client[host] - 1
                if left:
                    self.per_client[host] = left
                else:
                    del self.per_client[host]
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIME):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def _run(self, stream: trio.abc.Stream, served: Served) -> None:
        """The TLS handshake (within the idle limit, evictable), then the protocol the peer speaks."""
        first = b""
        with served.enter():
            if isinstance(stream, trio.SSLStream):
                try:
                    await stream.do_handshake()
                except trio.BrokenResourceError:
                    return
                alpn = stream.selected_alpn_protocol()
                sock = stream.transport_stream.socket
                scheme = "https"
            else:
                alpn = None
                sock = cast(trio.SocketStream, stream).socket
                scheme = "http"
                if self.settings.http2:  # prior knowledge: the preface, or HTTP/1.1
                    while len(first) < len(H2_PREFACE) and H2_PREFACE.startswith(first):
                        chunk = await stream.receive_some(len(H2_PREFACE) - len(first))
                        if not chunk:
                            return
                        first += chunk
                    if first == H2_PREFACE:
                        alpn = "h2"
        if served.reads.cancelled_caught:
            return
        runner = Http2 if alpn == "h2" and self.settings.http2 else Http11
        await runner(stream, self.app, served, scheme=scheme, client=address(sock, True),
                     server=address(sock, False), on_app_error=self.app_error).run(first)
