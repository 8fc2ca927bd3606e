"""The 1.x-era MCP test peer: FastMCP from ``mcp<2``, run from ``.peers/mcp1-venv`` (never from agentd's venv).

Same options, tools, resources, side doors and ``LISTENING <url>`` line as ``sdk_server.py``, so tests can run
the same checks against a server that only speaks the handshake era (2025-11-25 and older).

FastMCP serves the tools; the lowlevel server underneath gets paginated list handlers (FastMCP returns one page)
and resource handlers with ``resources/subscribe`` and a ``-32002`` not-found carrying ``data.uri``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import weakref
from typing import Any

import anyio
from mcp import types
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.lowlevel import NotificationOptions
from mcp.shared.exceptions import McpError
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

try:
    from tests.peers.servers.uvicorn_peer import parse_peer_args, serve_app
except ModuleNotFoundError:  # run as a script (perhaps from another venv): this directory is on sys.path
    from uvicorn_peer import parse_peer_args, serve_app  # type: ignore[no-redef]

RESOURCE_NOT_FOUND = -32002
BLOB_BYTES = bytes(range(256))


class AddResult(BaseModel):
    sum: int


class LegacyPeer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.page_size: int = args.page_size
        self.counters: dict[str, int] = {"test://counter": 0}
        self.cancelled: list[dict[str, Any]] = []
        self.cancel_reasons: dict[str, str | None] = {}
        self.subscribers: dict[str, weakref.WeakSet[Any]] = {}
        self.sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self.added = 0
        self.mcp = FastMCP(
            "agentd-legacy-test-peer",
            instructions=args.instructions,
            json_response=args.mode in ("json", "stateless"),
            stateless_http=args.mode == "stateless",
            host=args.host,
            log_level="WARNING",
        )
        self._register_tools(args.tools)
        self._register_lowlevel()
        self._register_side_doors()

    # -- tools (FastMCP) -----------------------------------------------------------------------------------------

    def _register_tools(self, fillers: int) -> None:
        mcp = self.mcp

        @mcp.tool(description="Echo the text back.")
        def echo(text: str, ctx: Context) -> str:  # type: ignore[type-arg]
            self._remember(ctx)
            return text

        @mcp.tool(description="Add two integers.")
        def add(a: int, b: int) -> AddResult:
            return AddResult(sum=a + b)

        @mcp.tool(description="Return a tool error (isError).")
        def fail(message: str = "failed") -> types.CallToolResult:
            return types.CallToolResult(content=[types.TextContent(type="text", text=message)], isError=True)

        @mcp.tool(description="Return structuredContent violating its outputSchema.")
        def bad_structured() -> types.CallToolResult:
            return types.CallToolResult(content=[types.TextContent(type="text", text="oops")],
                                        structuredContent={"value": "not-an-integer"})

        @mcp.tool(description="Sleep, then answer; records cancellations.")
        async def slow(seconds: float, ctx: Context) -> str:  # type: ignore[type-arg]
            rid = ctx.request_id
            try:
                await anyio.sleep(seconds)  # real time: the peer's slow tool, a call in flight for a real client
            except anyio.get_cancelled_exc_class():
                reason = self.cancel_reasons.pop(str(rid), None)
                self.cancelled.append({"requestId": _as_id(rid), "reason": reason, "via": "notification"})
                raise
            return f"slept {seconds}"

        @mcp.tool(description="Increment a counter resource and notify subscribers.")
        async def bump(uri: str = "test://counter") -> str:
            value = await self.bump(uri)
            return f"{uri}={value}"

        @mcp.tool(description="Register a new tool and send tools/list_changed.")
        async def add_tool(name: str = "") -> str:
            return await self.add_tool(name or None)

        for i in range(fillers):
            self.mcp.add_tool(_filler(i), name=f"filler_{i:04d}", description=f"Filler tool {i}.")

    def _remember(self, ctx: Any) -> None:
        try:
            self.sessions.add(ctx.session)
        except Exception:
            pass

    async def bump(self, uri: str) -> int:
        self.counters[uri] = self.counters.get(uri, 0) + 1
        for session in list(self.subscribers.get(uri, ())):
            try:
                await session.send_resource_updated(uri)
            except Exception:
                self.subscribers[uri].discard(session)
        return self.counters[uri]

    async def add_tool(self, name: str | None) -> str:
        self.added += 1
        tool_name = name or f"added_{self.added}"
        self.mcp.add_tool(_filler(0), name=tool_name, description="Added at runtime.")
        for session in list(self.sessions):
            try:
                await session.send_tool_list_changed()
            except Exception:
                self.sessions.discard(session)
        return tool_name

    # -- lowlevel handlers -----------------------------------------------------------------------------------------

    def _page(self, items: list[Any], cursor: str | None) -> tuple[list[Any], str | None]:
        start = 0
        if cursor is not None:
            try:
                start = int(cursor)
            except ValueError:
                raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=f"invalid cursor {cursor!r}"))
            if not 0 <= start <= len(items):
                raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=f"invalid cursor {cursor!r}"))
        if self.page_size <= 0:
            return items[start:], None
        end = start + self.page_size
        return items[start:end], (str(end) if end < len(items) else None)

    def resources(self) -> list[types.Resource]:
        return [
            types.Resource(uri="test://static", name="static", mimeType="text/plain"),  # type: ignore[arg-type]
            types.Resource(uri="test://blob", name="blob", mimeType="application/octet-stream"),  # type: ignore[arg-type]
            types.Resource(uri="test://counter", name="counter", mimeType="application/json"),  # type: ignore[arg-type]
            types.Resource(uri="test://cancelled", name="cancelled", mimeType="application/json"),  # type: ignore[arg-type]
        ]

    def _register_lowlevel(self) -> None:
        low = self.mcp._mcp_server
        original_options = low.create_initialization_options

        def options(notification_options: Any = None, experimental_capabilities: Any = None, **kw: Any) -> Any:
            opts = original_options(
                notification_options or NotificationOptions(tools_changed=True, resources_changed=True),
                experimental_capabilities or {}, **kw)
            # 1.x hard-codes subscribe=False even with a subscribe handler registered.
            if opts.capabilities.resources is not None:
                opts.capabilities.resources.subscribe = True
            return opts

        low.create_initialization_options = options  # type: ignore[method-assign]

        async def list_tools(req: types.ListToolsRequest) -> types.ServerResult:
            self._remember_current()
            tools = await self.mcp.list_tools()
            cursor = req.params.cursor if req.params else None
            page, next_cursor = self._page(tools, cursor)
            for tool in page:
                low._tool_cache[tool.name] = tool
            return types.ServerResult(types.ListToolsResult(tools=page, nextCursor=next_cursor))

        async def list_resources(req: types.ListResourcesRequest) -> types.ServerResult:
            cursor = req.params.cursor if req.params else None
            page, next_cursor = self._page(self.resources(), cursor)
            return types.ServerResult(types.ListResourcesResult(resources=page, nextCursor=next_cursor))

        async def list_templates(req: Any) -> types.ServerResult:
            return types.ServerResult(types.ListResourceTemplatesResult(resourceTemplates=[
                types.ResourceTemplate(uriTemplate="test://item/{id}", name="item", mimeType="text/plain")]))

        async def read(req: types.ReadResourceRequest) -> types.ServerResult:
            uri = str(req.params.uri)
            contents: list[Any]
            if uri == "test://static":
                contents = [types.TextResourceContents(uri=uri, mimeType="text/plain", text="static text")]  # type: ignore[arg-type]
            elif uri == "test://blob":
                contents = [types.BlobResourceContents(uri=uri, mimeType="application/octet-stream",  # type: ignore[arg-type]
                                                       blob=base64.b64encode(BLOB_BYTES).decode())]
            elif uri == "test://cancelled":
                contents = [types.TextResourceContents(uri=uri, mimeType="application/json",  # type: ignore[arg-type]
                                                       text=json.dumps(self.cancelled))]
            elif uri in self.counters:
                contents = [types.TextResourceContents(uri=uri, mimeType="application/json",  # type: ignore[arg-type]
                                                       text=json.dumps(self.counters[uri]))]
            elif uri.startswith("test://item/") and len(uri) > len("test://item/"):
                contents = [types.TextResourceContents(uri=uri, mimeType="text/plain",  # type: ignore[arg-type]
                                                       text=f"item {uri.removeprefix('test://item/')}")]
            else:
                raise McpError(types.ErrorData(code=RESOURCE_NOT_FOUND, message="Resource not found",
                                               data={"uri": uri}))
            return types.ServerResult(types.ReadResourceResult(contents=contents))

        async def subscribe(req: types.SubscribeRequest) -> types.ServerResult:
            session = low.request_context.session
            self.subscribers.setdefault(str(req.params.uri), weakref.WeakSet()).add(session)
            self.sessions.add(session)
            return types.ServerResult(types.EmptyResult())

        async def unsubscribe(req: types.UnsubscribeRequest) -> types.ServerResult:
            self.subscribers.get(str(req.params.uri), weakref.WeakSet()).discard(low.request_context.session)
            return types.ServerResult(types.EmptyResult())

        low.request_handlers[types.ListToolsRequest] = list_tools
        low.request_handlers[types.ListResourcesRequest] = list_resources
        low.request_handlers[types.ListResourceTemplatesRequest] = list_templates
        low.request_handlers[types.ReadResourceRequest] = read
        low.request_handlers[types.SubscribeRequest] = subscribe
        low.request_handlers[types.UnsubscribeRequest] = unsubscribe

    def _remember_current(self) -> None:
        try:
            self.sessions.add(self.mcp._mcp_server.request_context.session)
        except Exception:
            pass

    # -- side doors --------------------------------------------------------------------------------------------

    def _register_side_doors(self) -> None:
        @self.mcp.custom_route("/_test/bump", methods=["POST"])
        async def bump(request: Request) -> Response:
            return JSONResponse({"value": await self.bump(request.query_params.get("uri", "test://counter"))})

        @self.mcp.custom_route("/_test/add_tool", methods=["POST"])
        async def add_tool(request: Request) -> Response:
            return JSONResponse({"name": await self.add_tool(request.query_params.get("name"))})

        @self.mcp.custom_route("/_test/cancelled", methods=["GET"])
        async def cancelled(request: Request) -> Response:
            return JSONResponse(self.cancelled)

    def app(self) -> Any:
        inner = self.mcp.streamable_http_app()
        peer = self

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            """Peek at POST bodies for ``notifications/cancelled`` reasons (1.x hides them from handlers)."""
            if scope["type"] != "http" or scope.get("method") != "POST":
                await inner(scope, receive, send)
                return
            chunks: list[dict[str, Any]] = []
            body = b""
            while True:
                message = await receive()
                chunks.append(message)
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            peer._note_cancel(body)

            async def replay() -> Any:
                return chunks.pop(0) if chunks else await receive()

            await inner(scope, replay, send)

        return app

    def _note_cancel(self, body: bytes) -> None:
        try:
            msg = json.loads(body)
        except ValueError:
            return
        for item in msg if isinstance(msg, list) else [msg]:
            if isinstance(item, dict) and item.get("method") == "notifications/cancelled":
                params = item.get("params") or {}
                self.cancel_reasons[str(params.get("requestId"))] = params.get("reason")


def _as_id(rid: Any) -> Any:
    try:
        return int(rid)
    except (TypeError, ValueError):
        return rid


def _filler(i: int) -> Any:
    def filler() -> str:
        return f"filler {i} ok"

    return filler


async def serve(args: argparse.Namespace) -> None:
    await serve_app(LegacyPeer(args).app(), args.host, args.port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parse_peer_args("1.x-era MCP test peer (FastMCP, mcp<2)", argv)


if __name__ == "__main__":
    try:
        asyncio.run(serve(parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
