"""One HTTP/2 connection on h2, served to an ASGI app (only with ``--serve-http2``).

One task reads the socket and feeds h2; each stream runs the app in a task of its own. Writes go through one
lock (h2 frames from several streams must not interleave mid-frame). Bounds, each closing only this
connection:

- at most ``h2_max_streams`` concurrent streams (advertised; h2 refuses more);
- control frames (PING, SETTINGS, PRIORITY, RST_STREAM, each kind on its own) at most
  ``h2_max_control_per_second`` a second: past it a GOAWAY with ``ENHANCE_YOUR_CALM`` and a close;
- the idle limit applies with no stream open, whatever frames come (a PING is not activity);
- a protocol error is a GOAWAY with ``PROTOCOL_ERROR`` and a close.

A request body is acknowledged (flow control) as the app reads it, so a peer cannot buffer more than its window.
"""

from __future__ import annotations

from typing import Final, cast

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from agentd.transport.served import READ_SIZE, Message, Runner, Scope, http_scope

_CONTROL: Final = (h2.events.PingReceived, h2.events.RemoteSettingsChanged, h2.events.PriorityUpdated,
                   h2.events.StreamReset)
#: Headers HTTP/2 forbids (RFC 9113 8.2.2); an app's are dropped rather than failing the stream.
_HOP_BY_HOP: Final = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


@attrs.define(eq=False)
class Rate:
    """Counts one kind of frame in one-second windows."""

    window: float = -1.0
    count: int = 0

    def over(self, now: float, limit: int) -> bool:
        if now - self.window >= 1.0:
            self.window, self.count = now, 0
        self.count += 1
        return self.count > limit


class _Stream:
    def __init__(self, connection: Http2, stream_id: int, head_only: bool) -> None:
        self.connection = connection
        self.id = stream_id
        self.head_only = head_only
        self.chunks: list[bytes] = []
        self.unacked = 0
        self.ended = False
        self.delivered = False
        self.gone = False
        self.head: list[tuple[bytes, bytes]] | None = None
        self.headers_sent = False
        self.finished = False
        self.waiter: trio.Event | None = None

    def wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None

    async def receive(self) -> Message:
        while True:
            if self.chunks:
                body = b"".join(self.chunks)
                self.chunks = []
                if self.unacked and not self.gone:
                    self.connection.conn.acknowledge_received_data(self.unacked, self.id)
                    self.unacked = 0
                    await self.connection.flush()
                self.delivered = self.ended
                return {"type": "http.request", "body": body, "more_body": not self.ended}
            if self.ended and not self.delivered:
                self.delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if self.gone or self.finished:
                return {"type": "http.disconnect"}
            self.waiter = waiter = trio.Event()
            await waiter.wait()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.head is not None:
                raise RuntimeError("http.response.start sent twice")
            self.head = [(b":status", str(int(message["status"])).encode("ascii"))] + [
                (bytes(name).lower(), bytes(value)) for name, value in message.get("headers", ())
                if bytes(name).lower() not in _HOP_BY_HOP]
        elif kind == "http.response.body":
            if self.head is None or self.finished:
                raise RuntimeError("http.response.body outside a response")
            body = b"" if self.head_only else message.get("body", b"")
            more = bool(message.get("more_body", False))
            self.finished = not more
            if self.gone:
                return
            try:
                await self._send(body, end=not more)
            except h2.exceptions.StreamClosedError:
                self.gone = True  # reset by the peer meanwhile

    async def _send(self, body: bytes, end: bool) -> None:
        conn = self.connection.conn
        if not self.headers_sent:
            assert self.head is not None
            self.headers_sent = True
            conn.send_headers(self.id, self.head, end_stream=end and not body)
        while body:
            window = min(conn.local_flow_control_window(self.id), conn.max_outbound_frame_size)
            if window <= 0:
                await self.connection.flush()
                await self.connection.window_opened.park()
                if self.gone:
                    return
                continue
            chunk, body = body[:window], body[window:]
            conn.send_data(self.id, chunk, end_stream=end and not body)
        await self.connection.flush()


class Http2(Runner):
    """Serves one HTTP/2 connection until the peer closes, the idle limit passes, or a bound closes it."""

    def setup(self) -> None:
        served = self.served
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: served.settings.h2_max_streams,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: served.settings.h2_max_header_list,
            h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL: 0,
        })
        self.streams: dict[int, _Stream] = {}
        self.rates: dict[type, Rate] = {}
        self.window_opened = trio.lowlevel.ParkingLot()
        self.lock = trio.Lock()
        self.broken = False
        self._nursery: trio.Nursery | None = None

    async def run(self, first: bytes = b"") -> None:
        self.conn.initiate_connection()
        await self.flush()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with self.served.enter():
                data = first or await self._receive()
                while data and not self.broken and await self._take(data):
                    data = await self._receive()
            for stream in self.streams.values():
                stream.gone = True
                stream.wake()
            self.window_opened.unpark_all()

    async def _receive(self) -> bytes:
        try:
            return cast(bytes, await self.stream.receive_some(READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _take(self, data: bytes) -> bool:
        """Feed h2; False when the connection is to close."""
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            await self._goaway(h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return False
        now = trio.current_time()
        for event in events:
            if isinstance(event, _CONTROL):
                rate = self.rates.setdefault(type(event), Rate())
                if rate.over(now, self.served.settings.h2_max_control_per_second):
                    await self._goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                    return False
            if isinstance(event, h2.events.RequestReceived):
                self._start(event)
            elif isinstance(event, h2.events.DataReceived):
                self._data(event)
            elif isinstance(event, h2.events.StreamEnded):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.ended = True
                    stream.wake()
            elif isinstance(event, h2.events.StreamReset):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.gone = True
                    stream.wake()
                    self.window_opened.unpark_all()
            elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                self.window_opened.unpark_all()
            elif isinstance(event, h2.events.ConnectionTerminated):
                return False
        await self.flush()
        return True

    def _start(self, event: h2.events.RequestReceived) -> None:
        assert event.stream_id is not None
        assert self._nursery is not None
        if self.served.closing:
            self.conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        pseudo: dict[bytes, bytes] = {}
        headers: list[tuple[bytes, bytes]] = []
        for name, value in event.headers or ():
            name, value = bytes(name), bytes(value)
            if name.startswith(b":"):
                pseudo[name] = value
            else:
                headers.append((name, value))
        if b":authority" in pseudo and not any(name == b"host" for name, _ in headers):
            headers.append((b"host", pseudo[b":authority"]))
        method = pseudo.get(b":method", b"GET")
        scope = http_scope(method, pseudo.get(b":path", b"/"), headers, "2", self.scheme, self.client, self.server)
        stream = self.streams[event.stream_id] = _Stream(self, event.stream_id, head_only=method == b"HEAD")
        if event.stream_ended is not None:
            stream.ended = True
        self.served.busy()
        self._nursery.start_soon(self._serve, scope, stream)

    def _data(self, event: h2.events.DataReceived) -> None:
        assert event.stream_id is not None
        stream = self.streams.get(event.stream_id)
        size = event.flow_controlled_length or 0
        if stream is None or stream.finished:
            self.conn.acknowledge_received_data(size, event.stream_id)  # nobody reads it: do not hold the window
            return
        stream.chunks.append(bytes(event.data or b""))
        stream.unacked += size
        if event.stream_ended is not None:
            stream.ended = True
        stream.wake()

    async def _serve(self, scope: Scope, stream: _Stream) -> None:
        try:
            await self.app(scope, stream.receive, stream.send)
        except Exception as exc:
            self.on_app_error(exc)
            if stream.head is None and not stream.gone:
                await stream.send({"type": "http.response.start", "status": 500,
                                   "headers": [(b"content-length", b"0")]})
                await stream.send({"type": "http.response.body", "body": b""})
        if not stream.finished and not stream.gone and not self.broken:
            try:
                self.conn.reset_stream(stream.id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            except h2.exceptions.StreamClosedError:
                pass
            await self.flush()
        del self.streams[stream.id]
        if not self.streams:
            self.served.rest()
            if self.served.closing:
                self.served.reads.cancel()

    async def _goaway(self, code: h2.errors.ErrorCodes) -> None:
        self.conn.close_connection(error_code=code)
        await self.flush()

    async def flush(self) -> None:
        async with self.lock:
            data = self.conn.data_to_send()
            if not data or self.broken:
                return
            written = False
            try:
                await self.stream.send_all(data)
                written = True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                if not written:
                    self.broken = True
                    self.served.reads.cancel()
