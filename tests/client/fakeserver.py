"""A tiny in-process HTTP/1.1 server (trio + h11) for scripted and misbehaving MCP peers.

Each test passes a handler ``async def handler(req, resp)``; ``resp`` can answer with a whole body or start
a streamed response and write chunks (SSE) at its own pace. ``mcp_answer`` gives a well-behaved default for
the methods a test does not script, so a bad-peer test only scripts the one thing it breaks.

It runs in the test's own trio run, so tests on trio's autojump clock stay deterministic (no subprocess
whose real-time latency would let the mock clock jump).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import h11
import trio


@attrs.define
class Req:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def rpc_method(self) -> str | None:
        obj = self.json if self.method == "POST" else None
        return obj.get("method") if isinstance(obj, dict) else None


class Resp:
    def __init__(self, stream: trio.abc.Stream, conn: h11.Connection) -> None:
        self._stream = stream
        self._conn = conn
        self.started = False

    async def _send(self, event: Any) -> None:
        data = self._conn.send(event)
        if data:
            await self._stream.send_all(data)

    async def start(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.started = True
        hs = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await self._send(h11.Response(status_code=status, headers=hs))

    async def write(self, data: bytes) -> None:
        await self._send(h11.Data(data=data))

    async def end(self) -> None:
        await self._send(h11.EndOfMessage())

    async def body(self, status: int, body: bytes, content_type: str = "application/json",
                   headers: dict[str, str] | None = None) -> None:
        hs = {"content-type": content_type, "content-length": str(len(body)), **(headers or {})}
        await self.start(status, hs)
        await self.write(body)
        await self.end()

    async def json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        await self.body(status, json.dumps(obj).encode(), headers=headers)

    async def accepted(self) -> None:
        await self.body(202, b"", content_type="text/plain")

    async def abort(self) -> None:
        """Drop the connection mid-response."""
        await self._stream.aclose()


Handler = Callable[[Req, Resp], Awaitable[None]]


def result(req: Req, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req.json["id"], "result": value}


def error(req: Req, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": req.json.get("id") if isinstance(req.json, dict) else None, "error": err}


INIT_RESULT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {}, "resources": {"subscribe": True}},
    "serverInfo": {"name": "fake", "version": "0"},
}


async def mcp_answer(req: Req, resp: Resp, *, session: str = "s-1", init: dict[str, Any] | None = None) -> None:
    """A minimal well-behaved legacy server: one tool ``t``, one resource ``r://x``, no GET stream."""
    method = req.rpc_method
    if req.method == "GET":
        await resp.body(405, b"", content_type="text/plain")
    elif req.method == "DELETE":
        await resp.body(200, b"", content_type="text/plain")
    elif method is None or "id" not in req.json:
        await resp.accepted()
    elif method == "initialize":
        await resp.json(result(req, init or INIT_RESULT), headers={"mcp-session-id": session})
    elif method == "tools/list":
        await resp.json(result(req, {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}))
    elif method == "resources/list":
        await resp.json(result(req, {"resources": [{"uri": "r://x", "name": "x"}]}))
    elif method == "resources/templates/list":
        await resp.json(result(req, {"resourceTemplates": []}))
    elif method == "tools/call":
        await resp.json(result(req, {"content": [{"type": "text", "text": "ok"}], "isError": False}))
    elif method in ("ping", "resources/subscribe", "resources/unsubscribe"):
        await resp.json(result(req, {}))
    elif method == "resources/read":
        uri = req.json["params"]["uri"]
        await resp.json(result(req, {"contents": [{"uri": uri, "text": "x"}]}))
    else:
        await resp.json(error(req, -32601, "method not found"))


async def _handle_connection(raw: trio.SocketStream, handler: Handler, log: list[Req],
                             tls: ssl.SSLContext | None) -> None:
    conn = h11.Connection(h11.SERVER)
    stream: trio.abc.Stream = trio.SSLStream(raw, tls, server_side=True) if tls is not None else raw
    try:
        while True:
            request: h11.Request | None = None
            body = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            req = Req(request.method.decode(), request.target.decode(),
                      {k.decode().lower(): v.decode() for k, v in request.headers}, body)
            log.append(req)
            resp = Resp(stream, conn)
            await handler(req, resp)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError, h11.LocalProtocolError):
        return
    except ssl.SSLError:
        return
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


@attrs.define(eq=False)
class FakeServer:
    url: str
    requests: list[Req]
    scope: trio.CancelScope

    def methods(self) -> list[str | None]:
        return [r.rpc_method if r.method == "POST" else r.method for r in self.requests]

    def stop(self) -> None:
        self.scope.cancel()


async def serve_fake(handler: Handler, port: int = 0, *, tls: ssl.SSLContext | None = None,
                     task_status: trio.TaskStatus[FakeServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``handler`` on 127.0.0.1 until cancelled (or ``stop()``); started with the server handle."""
    with trio.CancelScope() as scope:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        bound = listeners[0].socket.getsockname()[1]
        log: list[Req] = []
        scheme = "https" if tls is not None else "http"
        server = FakeServer(f"{scheme}://127.0.0.1:{bound}/mcp", log, scope)
        async with trio.open_nursery() as nursery:
            task_status.started(server)
            try:
                while True:
                    stream = await listeners[0].accept()
                    nursery.start_soon(_handle_connection, stream, handler, log, tls)
            finally:
                for listener in listeners:
                    await listener.aclose()
