"""A configurable MCP test peer on the official Python SDK 2.x (dual-era, lowlevel ``Server``).

Run as a program: ``python tests/peers/servers/sdk_server.py --port 0``. It prints ``LISTENING <url>`` on stdout
once it accepts connections. It is a test tool, not agentd code: it runs on the SDK's own stack (anyio/asyncio,
starlette, uvicorn).

Why the lowlevel ``Server``: ``MCPServer`` returns every list in one page and does not serve legacy
``resources/subscribe``; tests need real ``nextCursor`` pages and both subscription eras.

Side doors (plain HTTP, same origin, not MCP):
- ``POST /_test/bump?uri=test://counter`` increments the counter behind ``uri`` and notifies subscribers.
- Subscribing ``test://racy...`` changes it while the ``resources/subscribe`` is in flight:
  ``test://racy-silent`` is incremented *before* the subscription is registered (nobody is told), and
  ``test://racy-notify`` right after, notifying the new subscriber before the subscribe is answered.
- ``POST /_test/add_tool?name=NAME`` registers a tool and sends ``tools/list_changed``.
- ``POST /_test/describe?name=NAME&description=TEXT`` changes a tool's description and sends ``tools/list_changed``.
- ``GET /_test/cancelled`` returns the JSON list of cancellations received (same as resource ``test://cancelled``).
- ``GET /_test/stats`` returns counters (requests by method, sessions seen).
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
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

try:
    from tests.peers.servers.uvicorn_peer import parse_peer_args, serve_app
except ModuleNotFoundError:  # run as a script (perhaps from another venv): this directory is on sys.path
    from uvicorn_peer import parse_peer_args, serve_app  # type: ignore[no-redef]

RESOURCE_NOT_FOUND = -32002
BLOB_BYTES = bytes(range(256))

ADD_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sum": {"type": "integer"}},
    "required": ["sum"],
    "additionalProperties": False,
}
STRICT_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"value": {"type": "integer"}},
    "required": ["value"],
}


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


def _text(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=text)]


def _connection(ctx: Any) -> Any:
    """The legacy session's connection (whose standalone channel is the GET stream), or None for modern requests.

    ``ctx.session`` is a per-request wrapper; the long-lived object is its connection (private in SDK 2.3, fine for
    a test peer).
    """
    connection = getattr(ctx.session, "_connection", None)
    if connection is None or getattr(connection, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS:
        return None
    return connection


class _PeerServer(Server[Any]):
    """Advertises ``listChanged`` to legacy clients (the lowlevel server takes it per call, not per server)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        options = notification_options or NotificationOptions(tools_changed=True, resources_changed=True)
        return super().create_initialization_options(options, experimental_capabilities, extensions)


class TestPeer:
    """All mutable state of one peer process: tools, counters, subscribers, recorded cancellations."""

    def __init__(self, *, filler_tools: int, page_size: int, instructions: str | None) -> None:
        self.page_size = page_size
        self.bus = InMemorySubscriptionBus()
        self.counters: dict[str, int] = {"test://counter": 0, "test://racy-silent": 0, "test://racy-notify": 0}
        self.cancelled: list[dict[str, Any]] = []
        self.cancel_reasons: dict[str, str | None] = {}
        self._notified: set[str] = set()
        self.subscribers: dict[str, weakref.WeakSet[Any]] = {}
        self.sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self.requests: dict[str, int] = {}
        self.tools: list[types.Tool] = [
            types.Tool(name="echo", description="Echo the text back.",
                       input_schema=_schema({"text": {"type": "string"}}, ["text"])),
            types.Tool(name="add", description="Add two integers.",
                       input_schema=_schema({"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
                       output_schema=ADD_OUTPUT_SCHEMA),
            types.Tool(name="fail", description="Return a tool error (isError).",
                       input_schema=_schema({"message": {"type": "string"}}, [])),
            types.Tool(name="bad_structured", description="Return structuredContent violating its outputSchema.",
                       input_schema=_schema({}, []), output_schema=STRICT_OUTPUT_SCHEMA),
            types.Tool(name="slow", description="Sleep, then answer; records cancellations.",
                       input_schema=_schema({"seconds": {"type": "number"}}, ["seconds"])),
            types.Tool(name="bump", description="Increment a counter resource and notify subscribers.",
                       input_schema=_schema({"uri": {"type": "string"}}, [])),
            types.Tool(name="add_tool", description="Register a new tool and send tools/list_changed.",
                       input_schema=_schema({"name": {"type": "string"}}, [])),
        ]
        self.tools += [
            types.Tool(name=f"filler_{i:04d}", description=f"Filler tool {i}.", input_schema=_schema({}, []))
            for i in range(filler_tools)
        ]
        self.resources: list[types.Resource] = [
            types.Resource(uri="test://static", name="static", mime_type="text/plain"),
            types.Resource(uri="test://blob", name="blob", mime_type="application/octet-stream"),
            types.Resource(uri="test://counter", name="counter", mime_type="application/json"),
            types.Resource(uri="test://cancelled", name="cancelled", mime_type="application/json"),
        ]
        self.added = 0
        self.server: Server[Any] = _PeerServer(
            "agentd-test-peer",
            version="1.0.0",
            instructions=instructions,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_templates,
            on_read_resource=self.read_resource,
            on_subscribe_resource=self.subscribe,
            on_unsubscribe_resource=self.unsubscribe,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        self.server.add_notification_handler(
            "notifications/cancelled", types.CancelledNotificationParams, self.on_cancelled
        )
        self.server.middleware.append(self.count_requests)

    # -- bookkeeping ---------------------------------------------------------------------------------------------

    async def count_requests(self, ctx: Any, call_next: Any) -> Any:
        self.requests[ctx.method] = self.requests.get(ctx.method, 0) + 1
        connection = _connection(ctx)
        if connection is not None:
            self.sessions.add(connection)
        return await call_next(ctx)

    def _page(self, items: list[Any], params: types.PaginatedRequestParams | None) -> tuple[list[Any], str | None]:
        start = 0
        if params is not None and params.cursor is not None:
            try:
                start = int(params.cursor)
            except ValueError:
                raise MCPError(types.INVALID_PARAMS, f"invalid cursor {params.cursor!r}") from None
            if not 0 <= start <= len(items):
                raise MCPError(types.INVALID_PARAMS, f"invalid cursor {params.cursor!r}")
        if self.page_size <= 0:
            return items[start:], None
        end = start + self.page_size
        return items[start:end], (str(end) if end < len(items) else None)

    # -- tools ---------------------------------------------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        page, cursor = self._page(self.tools, params)
        return types.ListToolsResult(tools=page, next_cursor=cursor)

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        args = params.arguments or {}
        name = params.name
        if name == "echo":
            return types.CallToolResult(content=_text(str(args.get("text", ""))))
        if name == "add":
            total = int(args["a"]) + int(args["b"])
            return types.CallToolResult(content=_text(str(total)), structured_content={"sum": total})
        if name == "fail":
            return types.CallToolResult(content=_text(str(args.get("message", "failed"))), is_error=True)
        if name == "bad_structured":
            return types.CallToolResult(content=_text("oops"), structured_content={"value": "not-an-integer"})
        if name == "slow":
            return await self._slow(ctx, float(args.get("seconds", 1.0)))
        if name == "bump":
            uri = str(args.get("uri") or "test://counter")
            value = await self.bump(uri)
            return types.CallToolResult(content=_text(f"{uri}={value}"), structured_content={"value": value})
        if name == "add_tool":
            tool = await self.add_tool(args.get("name"))
            return types.CallToolResult(content=_text(tool))
        if any(t.name == name for t in self.tools):
            return types.CallToolResult(content=_text(f"{name} ok"))
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")

    async def _slow(self, ctx: ServerRequestContext[Any], seconds: float) -> types.CallToolResult:
        rid = ctx.request_id
        try:
            await anyio.sleep(seconds)  # real time: the peer's slow tool, a call in flight for a real client
        except anyio.get_cancelled_exc_class():
            # A legacy notifications/cancelled arrives (and is recorded) before the scope is cancelled; a modern
            # client cancels by closing the response stream, which leaves no reason.
            reason = self.cancel_reasons.pop(str(rid), None)
            self.cancelled.append({"requestId": rid, "reason": reason,
                                   "via": "notification" if reason is not None or str(rid) in self._notified
                                   else "disconnect"})
            raise
        return types.CallToolResult(content=_text(f"slept {seconds}"))

    async def on_cancelled(self, ctx: ServerRequestContext[Any], params: types.CancelledNotificationParams) -> None:
        # The dispatcher cancels the handler's scope first and tees the notification here afterwards, so the
        # record may already exist: patch it in place.
        key = str(params.request_id)
        self._notified.add(key)
        for entry in self.cancelled:
            if str(entry["requestId"]) == key:
                entry["reason"] = params.reason
                entry["via"] = "notification"
                return
        self.cancel_reasons[key] = params.reason

    async def bump(self, uri: str) -> int:
        self.counters[uri] = self.counters.get(uri, 0) + 1
        for connection in list(self.subscribers.get(uri, ())):
            await connection.send_resource_updated(uri)  # best effort, never raises
        await self.bus.publish(ResourceUpdated(uri=uri))
        return self.counters[uri]

    async def add_tool(self, name: Any) -> str:
        self.added += 1
        tool_name = str(name) if name else f"added_{self.added}"
        self.tools.append(types.Tool(name=tool_name, description="Added at runtime.", input_schema=_schema({}, [])))
        for connection in list(self.sessions):
            await connection.send_tool_list_changed()  # best effort, never raises
        await self.bus.publish(ToolsListChanged())
        return tool_name

    async def describe(self, name: Any, description: Any) -> str:
        for index, tool in enumerate(self.tools):
            if tool.name == name:
                self.tools[index] = tool.model_copy(update={"description": str(description)})
        for connection in list(self.sessions):
            await connection.send_tool_list_changed()  # best effort, never raises
        await self.bus.publish(ToolsListChanged())
        return str(name)

    # -- resources -----------------------------------------------------------------------------------------------

    async def list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        page, cursor = self._page(self.resources, params)
        return types.ListResourcesResult(resources=page, next_cursor=cursor)

    async def list_templates(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template="test://item/{id}", name="item", mime_type="text/plain")
        ])

    async def read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        uri = str(params.uri)
        contents: list[types.TextResourceContents | types.BlobResourceContents]
        if uri == "test://static":
            contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text="static text")]
        elif uri == "test://blob":
            contents = [types.BlobResourceContents(uri=uri, mime_type="application/octet-stream",
                                                   blob=base64.b64encode(BLOB_BYTES).decode())]
        elif uri == "test://cancelled":
            contents = [types.TextResourceContents(uri=uri, mime_type="application/json",
                                                   text=json.dumps(self.cancelled))]
        elif uri in self.counters:
            contents = [types.TextResourceContents(uri=uri, mime_type="application/json",
                                                   text=json.dumps(self.counters[uri]))]
        elif uri.startswith("test://item/") and len(uri) > len("test://item/"):
            item = uri.removeprefix("test://item/")
            contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=f"item {item}")]
        else:
            raise MCPError(RESOURCE_NOT_FOUND, "Resource not found", data={"uri": uri})
        return types.ReadResourceResult(contents=contents)

    async def subscribe(self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
                        ) -> types.EmptyResult:
        connection = _connection(ctx)
        uri = str(params.uri)
        if uri == "test://racy-silent":
            self.counters[uri] = self.counters.get(uri, 0) + 1
        if connection is not None:
            self.subscribers.setdefault(uri, weakref.WeakSet()).add(connection)
        if uri == "test://racy-notify":
            await self.bump(uri)
            await anyio.sleep(0.2)  # real time: the update is on its way to a real client before the answer
        return types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
                          ) -> types.EmptyResult:
        connection = _connection(ctx)
        if connection is not None:
            self.subscribers.get(str(params.uri), weakref.WeakSet()).discard(connection)
        return types.EmptyResult()

    # -- side doors ----------------------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        async def bump(request: Request) -> Response:
            value = await self.bump(request.query_params.get("uri", "test://counter"))
            return JSONResponse({"value": value})

        async def add_tool(request: Request) -> Response:
            return JSONResponse({"name": await self.add_tool(request.query_params.get("name"))})

        async def describe(request: Request) -> Response:
            query = request.query_params
            return JSONResponse({"name": await self.describe(query.get("name"), query.get("description"))})

        async def cancelled(request: Request) -> Response:
            return JSONResponse(self.cancelled)

        async def stats(request: Request) -> Response:
            return JSONResponse({"requests": self.requests, "sessions": len(self.sessions)})

        return [
            Route("/_test/bump", bump, methods=["POST"]),
            Route("/_test/add_tool", add_tool, methods=["POST"]),
            Route("/_test/describe", describe, methods=["POST"]),
            Route("/_test/cancelled", cancelled, methods=["GET"]),
            Route("/_test/stats", stats, methods=["GET"]),
        ]


def build_app(args: argparse.Namespace) -> Any:
    peer = TestPeer(filler_tools=args.tools, page_size=args.page_size, instructions=args.instructions)
    return peer.server.streamable_http_app(
        json_response=args.mode in ("json", "stateless"),
        stateless_http=args.mode == "stateless",
        host=args.host,
        custom_starlette_routes=peer.routes(),
    )


async def serve(args: argparse.Namespace) -> None:
    await serve_app(build_app(args), args.host, args.port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parse_peer_args(__doc__.splitlines()[0] if __doc__ else None, argv)


if __name__ == "__main__":
    try:
        asyncio.run(serve(parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
