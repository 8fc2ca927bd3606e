"""An in-process MCP server (2025-11-25, JSON responses) that counts the tool calls it executes, for crash tests.

Real HTTP on 127.0.0.1 (hypercorn's trio worker). Two tools, both taking ``{"key": str, "hold": str}``:

* ``charge``: not idempotent (no ``idempotentHint``): every execution is a new charge;
* ``lookup``: annotated ``idempotentHint: true``: safe to send again.

``hold`` makes the FIRST call with a given key hang forever (so a test can SIGKILL agentd while it waits):
``before`` hangs before executing (the call is received, nothing happens), ``after`` executes, then hangs
before answering. ``received`` lists every call that arrived, ``executed`` every call that took effect; each
entry also holds the call's ``_meta`` (``meta``) and its ``params.idempotencyKey`` (``field``, None when absent).

Options: ``idempotency`` declares ``capabilities.tools.idempotency`` (the proposed standard field);
``forget_first_call`` answers the first ``tools/call`` with 404 (the session is forgotten: the client
re-initializes and sends the call again), after recording it; ``on_call`` is called with each call as it
arrives (before it is executed or held), on the server's task: what a test observes at that moment.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from tests.peers.asgi import Receive, Send, lifespan, read_body, send_json, serve_loopback

_ARGS = {"type": "object", "properties": {"key": {"type": "string"}, "hold": {"type": "string"}},
         "required": ["key"]}
TOOLS = [
    {"name": "charge", "description": "Charge the card once per call.", "inputSchema": _ARGS,
     "annotations": {"destructiveHint": True, "idempotentHint": False}},
    {"name": "lookup", "description": "Look the key up.", "inputSchema": _ARGS,
     "annotations": {"readOnlyHint": False, "idempotentHint": True}},
]


@attrs.define(eq=False)
class CountingPeer:
    origin: str = ""
    idempotency: bool = False
    forget_first_call: bool = False
    on_call: Callable[[dict[str, Any]], None] | None = None
    received: list[dict[str, Any]] = attrs.field(factory=list)
    executed: list[dict[str, Any]] = attrs.field(factory=list)
    #: The request headers of every ``initialize`` (one per handshake).
    handshakes: list[dict[str, str]] = attrs.field(factory=list)
    #: ``hold: "gate"`` makes a call wait until this is set, then execute and answer.
    gate: trio.Event = attrs.field(factory=trio.Event)
    _held: set[str] = attrs.field(factory=set)

    def count(self, name: str) -> int:
        return sum(1 for c in self.executed if c["name"] == name)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"] != "/mcp":
            await send_json(send, 404, {"error": "not_found"})
            return
        if scope["method"] in ("GET", "DELETE"):
            await send_json(send, 405 if scope["method"] == "GET" else 200, {})
            return
        message = json.loads(body)
        method = message.get("method")
        if "id" not in message:
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if method == "initialize":
            self.handshakes.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
            tools: dict[str, Any] = {"idempotency": {}} if self.idempotency else {}
            result: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": tools},
                                      "serverInfo": {"name": "counting", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            if self.forget_first_call and not self.received:
                self._record(message["params"])
                await send_json(send, 404, {"error": "session not found"})
                return
            result = await self._call(message["params"])
        elif method == "ping":
            result = {}
        else:
            await send_json(send, 200, {"jsonrpc": "2.0", "id": message["id"],
                                    "error": {"code": -32601, "message": "no such method"}})
            return
        extra = [(b"mcp-session-id", b"sess-1")] if method == "initialize" else []
        await send_json(send, 200, {"jsonrpc": "2.0", "id": message["id"], "result": result}, extra)

    def _record(self, params: dict[str, Any]) -> dict[str, Any]:
        args = params.get("arguments") or {}
        call = {"name": params["name"], "key": args.get("key"), "meta": params.get("_meta"),
                "field": params.get("idempotencyKey")}
        self.received.append(call)
        if self.on_call is not None:
            self.on_call(call)
        return call

    async def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        name, args = params["name"], params.get("arguments") or {}
        call = self._record(params)
        first = f"{name}:{args.get('key')}" not in self._held
        self._held.add(f"{name}:{args.get('key')}")
        if first and args.get("hold") == "before":
            await trio.sleep_forever()
        if args.get("hold") == "gate":
            await self.gate.wait()
        self.executed.append(call)
        if first and args.get("hold") == "after":
            await trio.sleep_forever()
        n = self.count(name)
        return {"content": [{"type": "text", "text": f"{name} {args.get('key')} done (execution #{n})"}],
                "isError": False}




@asynccontextmanager
async def counting_peer(**options: Any) -> AsyncIterator[CountingPeer]:
    app = CountingPeer(**options)
    async with serve_loopback(app) as origin:
        app.origin = origin
        yield app
