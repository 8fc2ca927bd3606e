"""One mounted app (or a table of them) served by agentd's own HTTP server on 127.0.0.1, and a raw WebSocket
client: what every test of agentd/transport's mounted apps goes through (real sockets, the real server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import wsproto
import wsproto.events

from agentd.mcp.jsonrpc import ErrorResponse, Request, Response
from agentd.mcp.server_session import ServerIdentity
from agentd.transport.asgi import App
from agentd.transport.mcp_handler import CallContext, ListenTicket
from agentd.transport.mounts import Mounts
from agentd.transport.serve import ServeConfig, Serving, serve_mcp
from agentd.transport.tenancy import LOCAL, Principal

JSON = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class EchoHandler:
    """An MCP handler the transport has never heard of: answers every request with its method and the caller."""

    identity = ServerIdentity("echo", "0", {})

    def streams(self, request: Request) -> bool:
        return request.method == "slow/echo"

    async def handle(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        if request.method == "slow/echo":
            await trio.sleep(0)
        return Response(request.id, {"method": request.method, "era": ctx.era.value, "who": ctx.principal.key})

    def open_stream(self, request: Request, ctx: CallContext) -> None:
        return None

    def listen(self, uris: list[str], sink: Callable[[str], None], principal: Principal = LOCAL, *,
               task_ids: tuple[str, ...] = (), task_sink: Callable[[dict[str, Any]], None] | None = None,
               ) -> ListenTicket:
        return ListenTicket(honored=list(uris), fire_now=[])

    def unlisten(self, ticket: ListenTicket) -> None:
        pass

    def session_closed(self, session_id: str) -> None:
        pass


@asynccontextmanager
async def served(app: App, *, websocket_paths: frozenset[str] = frozenset(),
                 path: str = "/mcp") -> AsyncIterator[Serving]:
    """``app`` on a free port until the block ends (a plain app is drained as a table of none)."""
    drainable = app if isinstance(app, Mounts) else _Undrained(app)
    cfg = ServeConfig(f"http://127.0.0.1:0{path}", websocket_paths=websocket_paths)
    async with trio.open_nursery() as nursery:
        serving: Serving = await nursery.start(lambda task_status: serve_mcp(
            drainable, cfg, shutdown_trigger=trio.sleep_forever, task_status=task_status))
        yield serving
        nursery.cancel_scope.cancel()


@attrs.frozen
class _Undrained:
    app: App

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    def drain(self) -> None:
        pass


@attrs.define(eq=False)
class WebSocketClient:
    """A WebSocket client on a raw socket (wsproto): the handshake's outcome, then the frames as they come."""

    sock: trio.SocketStream
    ws: wsproto.WSConnection
    outcome: Any = None
    pending: list[Any] = attrs.field(factory=list)

    async def next_event(self) -> Any:
        with trio.fail_after(10):
            while not self.pending:
                data = await self.sock.receive_some(65536)
                self.ws.receive_data(data or None)
                self.pending.extend(self.ws.events())
                if not data and not self.pending:
                    raise EOFError
        return self.pending.pop(0)

    async def text(self) -> str:
        while True:
            event = await self.next_event()
            if isinstance(event, wsproto.events.TextMessage):
                return str(event.data)
            assert not isinstance(event, wsproto.events.CloseConnection), event

    async def close_code(self) -> int:
        while True:
            event = await self.next_event()
            if isinstance(event, wsproto.events.CloseConnection):
                return int(event.code)


@asynccontextmanager
async def websocket(port: int, path: str, headers: dict[str, str] | None = None,
                    host: str = "127.0.0.1") -> AsyncIterator[WebSocketClient]:
    """Open a WebSocket on ``path``; ``outcome`` is wsproto's ``AcceptConnection`` or ``RejectConnection``."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as sock:
        client = WebSocketClient(sock, wsproto.WSConnection(wsproto.ConnectionType.CLIENT))
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await sock.send_all(client.ws.send(wsproto.events.Request(host=host, target=path, extra_headers=extra)))
        client.outcome = await client.next_event()
        yield client
