"""One HTTP/1.1 connection on h11, served to an ASGI app: agentd's own, so every limit is a line here.

One task reads the socket for the connection's whole life and feeds h11; each request runs the app in one
task of its own, which writes its response. Nothing else runs per request: no timer task (the idle limit is
the deadline of the scope the reader reads in, see :mod:`agentd.transport.served`), no lock, no queue.

- A response with a ``Content-Length`` leaves in one write (head and body together; its end is no bytes);
  a streamed one (SSE) sends its head at once and each chunk as it comes.
- The request head must be complete within the idle limit (slowloris), and is at most ``max_head`` bytes
  (else 431); a malformed request gets a 400; either closes the connection.
- A cleartext HTTP/2 preface gets 505 and a close (HTTP/2 is reached by ALPN or, when enabled, by the accept
  loop's look at the first bytes); an ``Upgrade: h2c`` is ignored (the request is answered in HTTP/1.1).
- ``GET`` with ``Upgrade: websocket`` becomes a WebSocket (:mod:`agentd.transport.websocket`) only on the
  configured paths; elsewhere the app answers it as plain HTTP.
- A failing app answers 500 if it had not started its response, else the connection closes.
"""

from __future__ import annotations

from typing import Final, cast

import h11
import trio

from agentd.transport.served import (
    READ_SIZE,
    REASONS,
    Message,
    Runner,
    Scope,
    http_date,
    http_scope,
)
from agentd.transport.websocket import WebSocket, is_websocket_upgrade

#: Unread request body a connection buffers before it stops reading (the app reads as it goes).
_BODY_BUFFER: Final = 256 * 1024

_DISCONNECT: Final = {"type": "http.disconnect"}


class _Exchange:
    """One request and its response: the ASGI ``receive`` and ``send`` of one app call."""

    def __init__(self, connection: Http11, head_only: bool) -> None:
        self.connection = connection
        self.head_only = head_only
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.ended = False  # the request body is all in
        self.delivered = False  # ... and the app has read its end
        self.gone = False  # the peer went away
        self.started = False  # the response head was produced
        self.finished = False  # ... and its end
        self.held = b""  # a sized response's head, held for its first body bytes
        self.waiter: trio.Event | None = None

    def wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None

    def receive_nowait(self) -> Message:
        """What has arrived, without waiting (``trio.WouldBlock`` when nothing has): the body, its end, or the
        peer's going."""
        if self.chunks:
            body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
            self.chunks, self.buffered = [], 0
            self.connection.resume_reading()
            self.delivered = self.ended
            return {"type": "http.request", "body": body, "more_body": not self.ended}
        if self.ended and not self.delivered:
            self.delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if self.gone or self.finished:
            return dict(_DISCONNECT)
        raise trio.WouldBlock

    async def receive(self) -> Message:
        while True:
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                pass
            if self.connection.conn.they_are_waiting_for_100_continue:
                await self.connection.write(self.connection.conn.send(h11.InformationalResponse(
                    status_code=100, headers=[], reason=b"Continue")) or b"")
            self.waiter = waiter = trio.Event()
            await waiter.wait()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        conn = self.connection.conn
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            status = int(message["status"])
            headers = [(bytes(name), bytes(value)) for name, value in message.get("headers", ())]
            sized = any(name.lower() == b"content-length" for name, _ in headers)
            headers.append((b"date", http_date()))
            data = conn.send(h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, b""))) or b""
            if sized:
                self.held = data
            else:
                await self.connection.write(data)
        elif kind == "http.response.body":
            if not self.started or self.finished:
                raise RuntimeError("http.response.body outside a response")
            body = message.get("body", b"")
            more = bool(message.get("more_body", False))
            out, self.held = self.held, b""
            if body and not self.head_only:
                out += conn.send(h11.Data(data=body)) or b""
            if not more:
                self.finished = True
                out += conn.send(h11.EndOfMessage()) or b""
            if out:
                await self.connection.write(out)
            if not more:
                self.wake()


class Http11(Runner):
    """Serves one HTTP/1.1 connection until the peer closes, the idle limit passes, or it is closed."""

    def setup(self) -> None:
        served = self.served
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=served.settings.max_head)
        self.exchange: _Exchange | None = None
        self.websocket: WebSocket | None = None
        self.broken = False  # a write was interrupted, or the peer is gone: no further response on this connection
        self._nursery: trio.Nursery | None = None
        self._reading: trio.Event | None = None

    async def run(self, first: bytes = b"") -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with self.served.enter():
                await self._read_loop(first)
            self._peer_gone()

    async def _read_loop(self, first: bytes) -> None:
        if first:
            self.conn.receive_data(first)
            refused = self._advance()
            if refused is not None:
                await self._refuse(refused)
                return
        while True:
            if self._reading is not None:
                await self._reading.wait()  # the app has not taken the body buffered so far
            try:
                data = cast(bytes, await self.stream.receive_some(READ_SIZE))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if self.websocket is not None:
                out = self.websocket.feed(data)
                if out:
                    await self.websocket.write(out)
                if not data or self.websocket.closed:
                    return
                continue
            if not data:
                return
            self.conn.receive_data(data)
            refused = self._advance()
            if refused is not None:
                await self._refuse(refused)
                return

    def resume_reading(self) -> None:
        if self._reading is not None:
            self._reading.set()
            self._reading = None

    def _peer_gone(self) -> None:
        if self.exchange is not None:
            self.exchange.gone = True
            self.exchange.wake()
        if self.websocket is not None:
            self.websocket.peer_gone()

    def _advance(self) -> int | None:
        """Take every complete h11 event; returns a status to refuse the connection with, if any."""
        conn = self.conn
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                return exc.error_status_hint
            kind = type(event)
            if kind is h11.Request:
                refused = self._start(event)  # type: ignore[arg-type]
                if refused is not None:
                    return refused
            elif kind is h11.Data:
                exchange = self.exchange
                if exchange is not None and not exchange.finished:  # else the app answered without it: dropped
                    exchange.chunks.append(event.data)  # type: ignore[union-attr]
                    exchange.buffered += len(event.data)  # type: ignore[union-attr]
                    exchange.wake()
                    if exchange.buffered > _BODY_BUFFER and self._reading is None:
                        self._reading = trio.Event()
            elif kind is h11.EndOfMessage:
                if self.exchange is not None:
                    self.exchange.ended = True
                    self.exchange.wake()
            elif event is h11.PAUSED:
                if self.exchange is None and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()  # the app answered before the body's end, which is now in
                    continue
                return None
            else:  # NEED_DATA, or ConnectionClosed (the read loop ends on the empty read)
                return None

    def _start(self, request: h11.Request) -> int | None:
        if request.http_version != b"1.1" and request.http_version != b"1.0":
            return 505  # a cleartext HTTP/2 preface (``PRI * HTTP/2.0``) while HTTP/2 is off, or anything newer
        headers = list(request.headers)
        if sum(len(name) + len(value) for name, value in headers) > self.served.settings.max_head:
            return 431  # h11 bounds only a head that arrives in pieces
        self.served.busy()
        scope = http_scope(request.method, request.target, headers,
                           request.http_version.decode("ascii"), self.scheme, self.client, self.server)
        assert self._nursery is not None
        if scope["method"] == "GET" and scope["path"] in self.served.settings.websocket_paths \
                and is_websocket_upgrade(scope["headers"]):
            self.websocket = WebSocket(self, scope)
            self._nursery.start_soon(self.websocket.serve, self.app)
            return None
        exchange = self.exchange = _Exchange(self, head_only=scope["method"] == "HEAD")
        self._nursery.start_soon(self._serve, scope, exchange)
        return None

    async def _serve(self, scope: Scope, exchange: _Exchange) -> None:
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            self.on_app_error(exc)
            if not exchange.started and not self.broken:
                await self._error_response(exchange, 500)
        if not exchange.finished:
            if exchange.held:  # the app ended after a sized head without its body: the head still goes
                await self.write(exchange.held)
            self.broken = True  # a response cut short: the peer cannot tell where it ended
        self.request_done()

    async def _error_response(self, exchange: _Exchange, status: int) -> None:
        await exchange.send({"type": "http.response.start", "status": status,
                             "headers": [(b"content-length", b"0"), (b"connection", b"close")]})
        await exchange.send({"type": "http.response.body", "body": b""})

    def request_done(self) -> None:
        """The response is out (or given up): on to the next request, or close."""
        self.exchange = None
        conn = self.conn
        if self.broken or self.served.closing or conn.our_state is not h11.DONE \
                or conn.their_state not in (h11.DONE, h11.SEND_BODY):
            self.close()
            return
        self.served.rest()
        if conn.their_state is h11.DONE:
            conn.start_next_cycle()
            refused = self._advance()  # a pipelined request already buffered
            if refused is not None:
                self.close()

    def close(self) -> None:
        self.served.reads.cancel()

    async def _refuse(self, status: int) -> None:
        """A reply from the server itself, then the connection closes."""
        if self.exchange is not None or self.websocket is not None \
                or self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return  # a response is under way: just close
        try:
            data = self.conn.send(h11.Response(status_code=status, reason=REASONS.get(status, b""), headers=[
                (b"content-length", b"0"), (b"connection", b"close"), (b"date", http_date())])) or b""
            data += self.conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return
        await self.write(data)

    async def write(self, data: bytes) -> None:
        if self.broken:
            return
        written = False
        try:
            await self.stream.send_all(data)
            written = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._peer_gone()
        finally:
            if not written:  # cut mid-write (cancelled, or the peer went away): nothing more can follow
                self.broken = True
