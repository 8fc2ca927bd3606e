"""A WebSocket on an HTTP/1.1 connection (wsproto's framing), served to an ASGI app.

The handshake is HTTP/1.1's (h11 switches protocols when the app accepts; a close before accepting is a 403);
after it every frame is wsproto's. The app sees ``websocket.connect``, then ``websocket.receive`` for each
whole message and ``websocket.disconnect`` once, and may ``websocket.send`` and ``websocket.close``. PINGs are
answered as they come; a message larger than :data:`MAX_MESSAGE` closes the connection (1009).
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

import h11
import trio
import wsproto.connection
import wsproto.events
import wsproto.frame_protocol

from agentd.transport.served import App, Message, Scope, http_date

#: The largest message a peer may send (agentd's WebSocket is a server-to-client stream).
MAX_MESSAGE: Final = 64 * 1024
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Carrier(Protocol):
    """The HTTP/1.1 connection a WebSocket starts on (:class:`agentd.transport.http11.Http11`)."""

    conn: h11.Connection
    on_app_error: Callable[[BaseException], None]

    async def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


def is_websocket_upgrade(headers: list[tuple[bytes, bytes]]) -> bool:
    upgrade = connection = False
    for name, value in headers:
        if name == b"upgrade":
            upgrade = upgrade or value.strip().lower() == b"websocket"
        elif name == b"connection":
            connection = connection or b"upgrade" in (token.strip() for token in value.lower().split(b","))
    return upgrade and connection


def _accept_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    key = next((value.strip() for name, value in headers if name == b"sec-websocket-key"), None)
    if key is None:
        return None
    return base64.b64encode(hashlib.sha1(key + _GUID).digest())


class WebSocket:
    """One WebSocket: its ASGI ``receive``/``send``, and :meth:`feed` for the connection's reader."""

    def __init__(self, http: Carrier, scope: Scope) -> None:
        self.http = http
        self.scope: Scope = {**scope, "type": "websocket", "subprotocols": [], "scheme":
                             "wss" if scope["scheme"] == "https" else "ws"}
        del self.scope["method"]
        self.frames: wsproto.connection.Connection | None = None
        self.inbox: deque[Message] = deque([{"type": "websocket.connect"}])
        self.partial: list[str | bytes] = []
        self.partial_size = 0
        self.closed = False  # a close frame was sent, or the peer is gone
        self.waiter: trio.Event | None = None
        self.lock = trio.Lock()

    def _deliver(self, message: Message) -> None:
        self.inbox.append(message)
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None

    def peer_gone(self) -> None:
        self.closed = True
        self._deliver({"type": "websocket.disconnect", "code": 1006})

    async def receive(self) -> Message:
        while not self.inbox:
            self.waiter = waiter = trio.Event()
            await waiter.wait()
        return self.inbox.popleft()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.accept" and self.frames is None:
            await self._accept()
        elif kind == "websocket.close" and self.frames is None:
            await self._deny()
        elif kind == "websocket.send" and self.frames is not None and not self.closed:
            text = message.get("text")
            data = text if text is not None else message.get("bytes", b"")
            await self.write(self.frames.send(wsproto.events.Message(data=data)))
        elif kind == "websocket.close" and self.frames is not None and not self.closed:
            self.closed = True
            await self.write(self.frames.send(wsproto.events.CloseConnection(code=int(message.get("code", 1000)))))
            self.http.close()
        elif kind in ("websocket.accept", "websocket.close", "websocket.send") and self.closed:
            return  # the peer is gone: ASGI lets a send after disconnect be dropped
        else:
            raise RuntimeError(f"unexpected ASGI message on a WebSocket: {kind}")

    async def _accept(self) -> None:
        token = _accept_token(self.scope["headers"])
        if token is None:
            await self._deny(400)
            return
        conn = self.http.conn
        data = conn.send(h11.InformationalResponse(status_code=101, reason=b"Switching Protocols", headers=[
            (b"upgrade", b"websocket"), (b"connection", b"Upgrade"), (b"sec-websocket-accept", token)])) or b""
        self.frames = wsproto.connection.Connection(wsproto.connection.ConnectionType.SERVER)
        trailing, _ = conn.trailing_data
        await self.write(data)
        if trailing:
            out = self.feed(trailing)
            if out:
                await self.write(out)

    async def _deny(self, status: int = 403) -> None:
        conn = self.http.conn
        self.closed = True
        data = conn.send(h11.Response(status_code=status, headers=[
            (b"content-length", b"0"), (b"connection", b"close"), (b"date", http_date())])) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await self.write(data)
        self.http.close()

    def feed(self, data: bytes) -> bytes:
        """Bytes read from the peer (``b""``: it closed); returns what to write back (PONGs, a close reply).
        The reader stops once :attr:`closed`."""
        frames = self.frames
        if frames is None:  # not accepted yet: nothing may arrive before the switch but the peer's close
            if not data:
                self.peer_gone()
            return b""
        out = b""
        frames.receive_data(data or None)
        for event in frames.events():
            if isinstance(event, wsproto.events.Ping):
                out += frames.send(event.response())
            elif isinstance(event, wsproto.events.CloseConnection):
                if not self.closed and frames.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                    out += frames.send(event.response())
                self.closed = True
                self._deliver({"type": "websocket.disconnect", "code": event.code})
            elif isinstance(event, (wsproto.events.TextMessage, wsproto.events.BytesMessage)):
                self.partial.append(bytes(event.data) if isinstance(event.data, bytearray) else event.data)
                self.partial_size += len(event.data)
                if self.partial_size > MAX_MESSAGE:
                    if not self.closed:
                        out += frames.send(wsproto.events.CloseConnection(
                            code=wsproto.frame_protocol.CloseReason.MESSAGE_TOO_BIG))
                    self.peer_gone()
                    break
                if event.message_finished:
                    if isinstance(event, wsproto.events.TextMessage):
                        self._deliver({"type": "websocket.receive", "text": "".join(self.partial)})  # type: ignore[arg-type]
                    else:
                        self._deliver({"type": "websocket.receive", "bytes": b"".join(self.partial)})  # type: ignore[arg-type]
                    self.partial, self.partial_size = [], 0
        if not data and not self.closed:
            self.peer_gone()
        return out

    async def write(self, data: bytes) -> None:
        async with self.lock:
            await self.http.write(data)

    async def serve(self, app: App) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except Exception as exc:
            self.http.on_app_error(exc)
        if self.closed:
            return  # closed by the app (the connection with it) or by the peer (the reader ends on its own)
        if self.frames is None:
            await self._deny(500)  # the app ended (or failed) without accepting or refusing
            return
        self.closed = True
        await self.write(self.frames.send(wsproto.events.CloseConnection(code=1000)))
        self.http.close()
