"""A hostile MCP server: one behaviour per name, for :func:`tests.client.fakeserver.serve_fake`.

Each behaviour breaks one thing and is otherwise the well-behaved legacy server of ``mcp_answer`` (one tool
``t``), so a test through the real CLI sees exactly one kind of abuse. Endless behaviours write until the
client hangs up (the fake server ends the connection's task when a write fails); big ones are streamed in
chunks or built once, so the test process itself stays small.

=====================  =================================================================================
``garbage``            ``initialize`` answers 200 ``application/json`` with binary noise
``garbage_sse``        ``tools/call`` answers an event stream of binary noise
``endless_sse``        ``tools/call`` answers an event stream of keepalive comments, forever
``endless_line``       ``tools/call`` answers one SSE ``data:`` line that never ends
``huge_body``          ``tools/call`` answers a chunked JSON body that never ends (no Content-Length)
``huge_declared``      ``tools/call`` declares a 4 GiB Content-Length, then trickles
``endless_paging``     ``tools/list`` answers a fresh ``nextCursor`` on every page (after 50 ms), forever
``many_tools``         ``tools/list`` answers 100,000 tools in one page
``huge_descriptions``  ``tools/list`` answers tools with 10 MB descriptions
``invalid_schemas``    ``tools/list`` answers tools whose object schemas are broken, deep, recursive or unsafe
``malformed_tools``    ``tools/list`` answers tools that break the wire types (schema not an object, name 7)
``stall_list``         ``tools/list`` is never answered
``deep_json``          ``tools/list`` answers a result nested 100,000 arrays deep
``notification_flood`` ``tools/call`` streams notifications (log, progress, list_changed) and never answers
``get_flood``          the standing GET stream floods ``notifications/tools/list_changed`` and log messages
=====================  =================================================================================
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Awaitable, Callable

import trio

from tests.client.fakeserver import INIT_RESULT, Req, Resp, mcp_answer, result

Handler = Callable[[Req, Resp], Awaitable[None]]

_SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}
_NOISE = random.Random(1234).randbytes(64 * 1024)


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@functools.cache
def _many_tools() -> bytes:
    tools = [{"name": f"t{i}", "description": "d", "inputSchema": {"type": "object"}} for i in range(100_000)]
    return json.dumps({"tools": tools}).encode()


@functools.cache
def _huge_descriptions() -> list[dict[str, object]]:
    return [{"name": "t", "description": "D" * (10 * 1024 * 1024), "inputSchema": {"type": "object"}}]


def _invalid_schemas() -> list[dict[str, object]]:
    deep: dict[str, object] = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    return [
        {"name": "bad_type", "inputSchema": {"type": 5, "properties": []}},
        {"name": "ref_loop", "inputSchema": {"type": "object", "$ref": "#", "properties": {"a": {"$ref": "#"}}}},
        {"name": "ref_remote", "inputSchema": {"$ref": "http://127.0.0.1:9/schema.json"}},
        {"name": "redos", "inputSchema": {"type": "object", "properties": {"a": {"type": "string",
                                                                              "pattern": "^(a+)+$"}}}},
        {"name": "deep", "inputSchema": deep},
        {"name": "header_newline", "inputSchema": {"type": "object", "properties": {
            "a": {"type": "string", "x-mcp-header": "Foo\n"}}}},
        {"name": "", "inputSchema": {"type": "object"}},
        {"name": "ok", "inputSchema": {"type": "object"}},
    ]


def _malformed_tools() -> list[dict[str, object]]:
    return [{"name": "not_object", "inputSchema": "a string"}, {"name": "no_schema"},
            {"name": 7, "inputSchema": {"type": "object"}}, {"name": "ok", "inputSchema": {"type": "object"}}]


async def _stream_forever(resp: Resp, chunk: bytes, headers: dict[str, str] | None = None,
                          head: bytes = b"") -> None:
    await resp.start(200, headers or _SSE)
    if head:
        await resp.write(head)
    while True:
        await resp.write(chunk)


async def _garbage(req: Req, resp: Resp) -> None:
    if req.rpc_method == "initialize":
        await resp.body(200, _NOISE)
    else:
        await mcp_answer(req, resp)


async def _on_call(req: Req, resp: Resp, behaviour: Handler) -> None:
    if req.method == "POST" and req.rpc_method == "tools/call":
        await behaviour(req, resp)
    else:
        await mcp_answer(req, resp)


async def _garbage_sse(req: Req, resp: Resp) -> None:
    await resp.start(200, _SSE)
    await resp.write(_NOISE)
    await resp.end()


async def _endless_sse(req: Req, resp: Resp) -> None:
    await _stream_forever(resp, b": keepalive\n\n" * 64)


async def _endless_line(req: Req, resp: Resp) -> None:
    await _stream_forever(resp, b"y" * 65536, head=b"data: ")


async def _huge_body(req: Req, resp: Resp) -> None:
    head = b'{"jsonrpc":"2.0","id":' + json.dumps(req.json["id"]).encode() + b',"result":{"content":[{"type":"text","text":"'
    await _stream_forever(resp, b"z" * 65536, headers={"content-type": "application/json"}, head=head)


async def _huge_declared(req: Req, resp: Resp) -> None:
    await resp.start(200, {"content-type": "application/json", "content-length": str(4 * 1024**3)})
    while True:
        await resp.write(b" " * 65536)


async def _notification_flood(req: Req, resp: Resp) -> None:
    token = ((req.json.get("params") or {}).get("_meta") or {}).get("progressToken", "p")
    batch = b"".join([
        _event({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": "x" * 512}}),
        _event({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1}}),
        _event({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
    ]) * 32
    await _stream_forever(resp, batch)


async def _stall_list(req: Req, resp: Resp) -> None:
    if req.method == "POST" and req.rpc_method == "tools/list":
        await trio.sleep_forever()
    await mcp_answer(req, resp)


async def _endless_paging(req: Req, resp: Resp) -> None:
    if req.method == "POST" and req.rpc_method == "tools/list":
        # real time: slow enough that 1024 pages over a real socket take longer than any deadline a test sets
        await trio.sleep(0.05)
        page = int((req.json.get("params") or {}).get("cursor") or "0") + 1
        await resp.json(result(req, {"tools": [{"name": f"t{page}", "inputSchema": {"type": "object"}}],
                                     "nextCursor": str(page)}))
    else:
        await mcp_answer(req, resp)


async def _many(req: Req, resp: Resp) -> None:
    if req.method == "POST" and req.rpc_method == "tools/list":
        body = b'{"jsonrpc":"2.0","id":' + json.dumps(req.json["id"]).encode() + b',"result":' + _many_tools() + b"}"
        await resp.body(200, body)
    else:
        await mcp_answer(req, resp)


def _tools_list(tools: Callable[[], list[dict[str, object]]]) -> Handler:
    async def handler(req: Req, resp: Resp) -> None:
        if req.method == "POST" and req.rpc_method == "tools/list":
            await resp.json(result(req, {"tools": tools()}))
        else:
            await mcp_answer(req, resp)

    return handler


async def _deep_json(req: Req, resp: Resp) -> None:
    if req.method == "POST" and req.rpc_method == "tools/list":
        body = (b'{"jsonrpc":"2.0","id":' + json.dumps(req.json["id"]).encode() + b',"result":{"tools":[],"x":'
                + b"[" * 100_000 + b"]" * 100_000 + b"}}")
        await resp.body(200, body)
    else:
        await mcp_answer(req, resp)


_LISTENING = {**INIT_RESULT, "capabilities": {"tools": {"listChanged": True}, "logging": {}}}


async def _get_flood(req: Req, resp: Resp) -> None:
    if req.method == "GET":
        batch = (_event({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
                 + _event({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": "flood"}})) * 64
        await _stream_forever(resp, batch)
    else:
        await mcp_answer(req, resp, init=_LISTENING)


BEHAVIOURS: dict[str, Handler] = {
    "garbage": _garbage,
    "garbage_sse": functools.partial(_on_call, behaviour=_garbage_sse),
    "endless_sse": functools.partial(_on_call, behaviour=_endless_sse),
    "endless_line": functools.partial(_on_call, behaviour=_endless_line),
    "huge_body": functools.partial(_on_call, behaviour=_huge_body),
    "huge_declared": functools.partial(_on_call, behaviour=_huge_declared),
    "endless_paging": _endless_paging,
    "many_tools": _many,
    "huge_descriptions": _tools_list(_huge_descriptions),
    "invalid_schemas": _tools_list(_invalid_schemas),
    "malformed_tools": _tools_list(_malformed_tools),
    "stall_list": _stall_list,
    "deep_json": _deep_json,
    "notification_flood": functools.partial(_on_call, behaviour=_notification_flood),
    "get_flood": _get_flood,
}
