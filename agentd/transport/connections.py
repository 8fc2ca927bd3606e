"""agentd's own accept loop around hypercorn's per-connection protocol: one bad connection never ends the daemon.

hypercorn's worker (``hypercorn.trio.worker_serve``) runs every connection in one nursery, unguarded, so an
exception raised while handling one peer's bytes (h2's priority tree on a PRIORITY or reset flood, h11 after a
WebSocket upgrade with trailing bytes) ends the whole process, before any authentication. Here each connection
runs under :meth:`Connections.handle`: a failure is logged as ``serve.connection_error`` (rate-limited), that
connection is closed, and serving goes on.

The loop also:

- caps open connections, in total and per client (an IPv4 address, an IPv6 /64); at the total cap a new
  connection is still admitted and the *oldest idle* connection is closed instead, whatever its client (idle: it
  has sent nothing yet, or it is a keep-alive connection between requests; a connection with a request in flight
  is never cut), so idle connections from a handful of addresses cannot keep new clients out; with no idle
  connection to close, and at the per-client cap, the new connection is refused (``serve.refused`` events,
  rate-limited);
- survives accept errors such as ``EMFILE`` (an event, a short pause, no traceback);
- serves HTTP/2 only when enabled: otherwise TLS offers only ``http/1.1`` and a cleartext ``h2c`` Upgrade is
  ignored (answered in HTTP/1.1) and an ``h2c`` preface gets ``505`` and a close;
- bounds HTTP/2 control frames per connection (PING, SETTINGS, PRIORITY, RST_STREAM per second): past the bound
  the connection is closed with ``ENHANCE_YOUR_CALM``; PRIORITY frames for streams that do not exist are dropped;
- applies the idle limit to every protocol (a PING is not activity);
- upgrades to WebSocket only on the paths it is told (the daemon's ``/events`` stream); elsewhere the request
  goes to the app as plain HTTP and gets its ordinary answer.

Per-request costs of hypercorn's connection runner are cut (the served path's throughput at many clients is
bounded by its CPU per request): an HTTP/1.1 response with a ``Content-Length`` leaves in one write (head and
first body chunk together, no empty write for its end); the keep-alive idle limit is one task per connection
whose deadline moves, instead of a task cancelled and started again around every request (it ends with the
connection's reads); and neither a free write lock nor a read without ``read_timeout`` costs a checkpoint or
a cancel scope of its own.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Callable
from math import inf
from typing import Any, Final

import attrs
import h2.errors
import h2.events
import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import Request as StreamRequest
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import STREAM_ID, H2CProtocolRequiredError, H2ProtocolAssumedError, H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import parse_socket_addr

from agentd.events import EventLog

#: Accept errors that mean "out of a resource right now": pause and retry rather than fail.
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_PAUSE: Final = 0.1
#: HTTP/2 control frames (each kind counted on its own) a connection may send per second.
H2_MAX_CONTROL_PER_SECOND: Final = 100
#: Concurrent HTTP/2 streams per connection (advertised in SETTINGS_MAX_CONCURRENT_STREAMS).
H2_MAX_STREAMS: Final = 32
#: Rate-limited events: at most this many per second per kind; the rest are counted in the next one.
_EVENTS_PER_SECOND: Final = 5
#: How long closing a failed or refused connection may take.
_CLOSE_TIME: Final = 1.0


@attrs.frozen
class ConnectionLimits:
    """Per-process connection bounds (the defaults live in ``ServeConfig``)."""

    max_connections: int
    max_per_client: int
    http2: bool
    #: Paths whose ``GET`` with ``Upgrade: websocket`` becomes a WebSocket (``/events``); everywhere else an
    #: upgrade stays plain HTTP. A WebSocket connection that fails (an upgrade with trailing bytes) fails alone.
    websocket_paths: frozenset[str] = frozenset()


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


@attrs.define(eq=False)
class _Rate:
    """Counts one kind of frame in one-second windows."""

    _window: float = -1.0
    _count: int = 0

    def over(self, now: float, limit: int) -> bool:
        if now - self._window >= 1.0:
            self._window, self._count = now, 0
        self._count += 1
        return self._count > limit


class _RefusedH2(Exception):
    """A cleartext HTTP/2 preface while HTTP/2 is off: answered with 505, then the connection closes."""


class _H11(H11Protocol):
    """HTTP/1.1 without WebSocket, and without h2c unless HTTP/2 is enabled."""

    http2: bool = False
    websocket_paths: frozenset[str] = frozenset()

    async def _check_protocol(self, event: h11.Request) -> None:
        if self.http2:
            await super()._check_protocol(event)
        elif event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise _RefusedH2()
        # an ``Upgrade: h2c`` request is answered in HTTP/1.1 (the server may ignore an Upgrade)

    #: A sized response's head, held until its first body bytes (or whatever comes next) so both leave in one write.
    _held: bytes = b""

    async def _send_h11_event(self, event: Any) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        if type(event) is h11.Response and any(name == b"content-length" for name, _ in event.headers):
            self._held += data or b""  # hypercorn sends the body at once after a sized head (HTTPStream.app_send)
            return
        if self._held:
            data, self._held = self._held + (data or b""), b""
        if data:  # a sized body's end of message is no bytes at all: no write
            await self.send(RawData(data=data))

    async def stream_send(self, event: StreamEvent) -> None:
        if self._held and isinstance(event, StreamClosed):  # the app ended without a body: the head still goes
            data, self._held = self._held, b""
            await self.send(RawData(data=data))
        await super().stream_send(event)

    async def _create_stream(self, request: h11.Request) -> None:
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        if path in self.websocket_paths:
            await super()._create_stream(request)  # hypercorn's WebSocket (or plain HTTP) stream, as it decides
            return
        # hypercorn would switch to WebSocket framing here; nothing in agentd serves WebSocket, so the request
        # stays plain HTTP and the app answers it (404 for other paths, its usual reply for GET on the endpoint).
        self.stream = HTTPStream(self.app, self.config, self.context, self.task_group, self.ssl, self.client,
                                 self.server, self.stream_send, STREAM_ID)
        headers = request.headers.raw_items() if self.config.h11_pass_raw_headers else list(request.headers)
        await self.stream.handle(StreamRequest(
            stream_id=STREAM_ID, headers=headers, http_version=request.http_version.decode(),
            method=request.method.decode("ascii").upper(), raw_path=request.target, state=self.connection_state,
        ))
        self.keep_alive_requests += 1
        await self.context.mark_request()


class _H2(H2Protocol):
    """hypercorn's HTTP/2 with control frames bounded per connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rates: dict[type, _Rate] = {}

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        now = trio.current_time()
        kept: list[h2.events.Event] = []
        for event in events:
            if isinstance(event, (h2.events.PingReceived, h2.events.RemoteSettingsChanged,
                                  h2.events.PriorityUpdated, h2.events.StreamReset)):
                rate = self._rates.setdefault(type(event), _Rate())
                if rate.over(now, H2_MAX_CONTROL_PER_SECOND):
                    self.connection.close_connection(error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                    await self._flush()
                    await self.send(Closed())
                    return
                if isinstance(event, h2.events.PriorityUpdated) and event.stream_id not in self.streams:
                    continue  # a priority for a stream that does not exist would only grow the priority tree
            kept.append(event)
        await super()._handle_events(kept)


class _Protocol:
    """hypercorn's ``ProtocolWrapper`` with agentd's protocol classes."""

    def __init__(self, server: _Connection, client: tuple[str, int] | None, server_addr: tuple[str, int] | None,
                 ssl: bool, alpn_protocol: str | None, http2: bool,
                 websocket_paths: frozenset[str] = frozenset()) -> None:
        self._args = (server.app, server.config, server.context, server._task_group, ConnectionState(server.state),
                      ssl, client, server_addr, server.protocol_send)
        self.send = server.protocol_send
        self.protocol: H11Protocol | H2Protocol
        if alpn_protocol == "h2" and http2:
            self.protocol = _H2(*self._args)
        else:
            h11_protocol = _H11(*self._args)
            h11_protocol.http2 = http2
            h11_protocol.websocket_paths = websocket_paths
            self.protocol = h11_protocol

    async def initiate(self) -> None:
        await self.protocol.initiate()

    async def handle(self, event: Event) -> None:
        try:
            await self.protocol.handle(event)
        except _RefusedH2:
            h11_protocol = self.protocol
            assert isinstance(h11_protocol, H11Protocol)
            try:
                await h11_protocol._send_error_response(505)
            finally:
                await self.send(Closed())
        except H2ProtocolAssumedError as error:
            self.protocol = _H2(*self._args)
            await self.protocol.initiate()
            # the PRI request marked the connection busy; an HTTP/2 connection with no stream is idle
            await self.send(Updated(idle=True))
            if error.data != b"":
                await self.protocol.handle(RawData(data=error.data))
        except H2CProtocolRequiredError as error:
            self.protocol = _H2(*self._args)
            await self.protocol.initiate(error.headers, error.settings)
            if error.data != b"":
                await self.protocol.handle(RawData(data=error.data))


class _Connection(TCPServer):
    """hypercorn's connection runner, with :class:`_Protocol` (copied from ``TCPServer.run``, which hard-wires
    hypercorn's own wrapper)."""

    http2: bool = False
    websocket_paths: frozenset[str] = frozenset()
    #: When the connection last became idle (admitted, or its last request answered); see :meth:`idle`.
    idle_since: float = -inf
    #: Closed to make room for a new connection (it no longer counts against the total cap).
    evicted: bool = False
    #: The scope :meth:`Connections.handle` runs this connection in.
    scope: trio.CancelScope | None = None
    _reading: bool = False

    @property
    def idle(self) -> bool:
        """Nothing read yet (TLS handshake included), or a keep-alive connection between requests."""
        return not self._reading or self._idle_until != inf

    def evict(self) -> None:
        """Close this idle connection now. Before its reads start it is cancelled outright (no request can be in
        flight); after, its idle deadline moves to now, and the idle watch closes it unless a request has just
        come in (then the connection is busy and stays: the watch keeps watching, as at any idle deadline)."""
        self.evicted = True
        if not self._reading:
            if self.scope is not None:
                self.scope.cancel()
            return
        self._idle_until = trio.current_time()
        if self._idle_scope is not None:
            self._idle_scope.deadline = self._idle_until

    async def run(self) -> None:
        stream: Any = self.stream
        if isinstance(stream, trio.SSLStream):
            try:
                with trio.fail_after(self.config.ssl_handshake_timeout):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError):
                return
            alpn_protocol = stream.selected_alpn_protocol()
            sock = stream.transport_stream.socket
            ssl = True
        else:
            alpn_protocol = "http/1.1"
            sock = stream.socket
            ssl = False
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            async with TaskGroup() as task_group:
                self._task_group = task_group
                self.protocol = _Protocol(self, client, server, ssl, alpn_protocol, self.http2,  # type: ignore[assignment]
                                          self.websocket_paths)
                await self.protocol.initiate()
                self._idle_until = trio.current_time() + self.config.keep_alive_timeout
                self._idle_done = trio.CancelScope()
                task_group.spawn(self._idle_watch)
                self._reading = True
                try:
                    await self._read_data()
                finally:
                    self._idle_done.cancel()  # nothing more to read: no idle limit to keep (busy or not)
        except OSError:
            pass
        finally:
            await self._close()

    # The keep-alive idle limit, as hypercorn's ``_idle_timeout`` task has it: an idle connection closes after
    # ``keep_alive_timeout``, or at once when the server terminates; a busy one is left alone. One task for the
    # connection's life: ``Updated`` only moves its deadline (no task start, no lock, no checkpoint per request).
    _idle_until: float = inf
    _idle_scope: trio.CancelScope | None = None
    _idle_again: trio.lowlevel.ParkingLot | None = None
    _idle_done: trio.CancelScope

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            # hypercorn's write, without the lock's extra checkpoint when it is free (the write checkpoints)
            try:
                self.send_lock.acquire_nowait()
            except trio.WouldBlock:
                await self.send_lock.acquire()
            try:
                try:
                    with trio.CancelScope(shield=True):
                        await self.stream.send_all(event.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.protocol.handle(Closed())
            finally:
                self.send_lock.release()
            return
        if not isinstance(event, Updated):
            await super().protocol_send(event)
            return
        if event.idle:
            self.idle_since = trio.current_time()
            self._idle_until = self.idle_since + self.config.keep_alive_timeout
            if self._idle_again is not None:
                self._idle_again.unpark_all()
        else:
            self._idle_until = inf
            self.evicted = False  # a request came in just as it was chosen: it stays, and counts again
        if self._idle_scope is not None:
            self._idle_scope.deadline = self._idle_until

    async def _read_data(self) -> None:
        """hypercorn's read loop, without a timeout scope per read when there is no ``read_timeout``."""
        if self.config.read_timeout is not None:
            await super()._read_data()
            return
        while True:
            try:
                data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())

    async def _idle_watch(self) -> None:
        with self._idle_done:
            while True:
                with trio.CancelScope(deadline=self._idle_until) as scope:
                    self._idle_scope = scope
                    await self.context.terminated.wait()
                    while self._idle_until == inf:  # terminated while busy: close once this request is answered
                        self._idle_again = trio.lowlevel.ParkingLot()
                        await self._idle_again.park()
                self._idle_scope = None
                if not scope.cancelled_caught or self._idle_until != inf:
                    break
                # the deadline passed just as a request came in: the connection is busy again, keep watching
            with trio.CancelScope(shield=True):
                await self._initiate_server_close()


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

    app: AppWrapper
    config: HypercornConfig
    limits: ConnectionLimits
    log: EventLog
    context: WorkerContext = attrs.field(factory=lambda: WorkerContext(None))
    open: int = 0
    per_client: dict[str, int] = attrs.field(factory=dict)
    _throttles: dict[str, Throttle] = attrs.field(factory=dict)
    _admitted: set[_Connection] = attrs.field(factory=set)

    def _event(self, kind: str, emit: Callable[..., None], name: str, **fields: Any) -> None:
        held = self._throttles.setdefault(kind, Throttle()).allow(trio.current_time())
        if held is not None:
            emit(name, **fields, **({"suppressed": held} if held else {}))

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
            connection = _Connection(self.app, self.config, self.context, ConnectionState({}), stream)  # type: ignore[arg-type]
            connection.http2 = self.limits.http2
            connection.websocket_paths = self.limits.websocket_paths
            connection.idle_since = trio.current_time()
            self._admitted.add(connection)
            try:
                with trio.CancelScope() as connection.scope:
                    await connection.run()
            except* Exception as group:
                first = group.exceptions[0]
                # the class name only: a message may quote the peer's bytes (headers, tokens)
                self._event("error", self.log.warn, "serve.connection_error", error=type(first).__name__)
            finally:
                self._admitted.discard(connection)
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
