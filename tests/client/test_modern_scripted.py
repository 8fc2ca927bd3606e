"""Modern-wire edge cases against scripted in-process peers (autojump clock where time matters)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpConnectError, McpProtocolError, McpTransportError, ResourceNotFound
from agentd.mcp.meta import client_capabilities
from agentd.mcp.sse import encode_event
from agentd.mcp.versions import Era
from tests.client.fakeserver import INIT_RESULT, Req, Resp, error, mcp_answer, result, serve_fake
from tests.client.helpers import Events, server

CAPS = {"tools": {"listChanged": True}, "resources": {"subscribe": True}}
SUB_ID = "io.modelcontextprotocol/subscriptionId"


def modern_peer(*, listen: Any = None, overrides: dict[str, Any] | None = None, refusal: int = -32602,  # type: ignore[no-untyped-def]
                declared: tuple[str, ...] = ()):
    """A handshake-less peer; ``listen(req, resp)`` scripts subscriptions/listen, ``overrides`` other results;
    ``declared``: the client capabilities the host opted this server in to (expected in every envelope)."""

    async def handler(req: Req, resp: Resp) -> None:
        method = req.rpc_method
        if req.method != "POST":
            await resp.body(405, b"", content_type="text/plain")
            return
        if method == "initialize":
            await resp.json(error(req, refusal, "missing _meta envelope"), status=400)
            return
        meta = (req.json.get("params") or {}).get("_meta") or {}
        assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
        # agentd declares the tasks extension on tools/call and tasks/* only (agentd.mcp.tasks)
        assert meta["io.modelcontextprotocol/clientCapabilities"] == client_capabilities(method, declared)
        assert req.headers["mcp-protocol-version"] == "2026-07-28" and req.headers["mcp-method"] == method
        assert "mcp-session-id" not in req.headers
        if method == "server/discover":
            await resp.json(result(req, {"supportedVersions": ["2026-07-28"], "capabilities": CAPS,
                                         "serverInfo": {"name": "m", "version": "1"}, "ttlMs": 0}))
        elif method == "subscriptions/listen" and listen is not None:
            await listen(req, resp)
        elif overrides and method in overrides:
            await resp.json(result(req, overrides[method]))
        elif method == "resources/read":
            await resp.json(error(req, -32602, "Resource not found", {"uri": req.json["params"]["uri"]}))
        else:
            await mcp_answer(req, resp)

    return handler


async def test_refused_initialize_then_discover_switches_to_modern() -> None:
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, modern_peer(overrides={
            "tools/call": {"content": [], "resultType": "input_required",
                           "inputRequests": {"q": {"method": "sampling/createMessage", "params": {}}}}}))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            conn = pool.connections["s"]
            assert conn.era is Era.MODERN and conn.server_info is not None and conn.server_info.name == "m"
            with trio.fail_after(10), pytest.raises(ResourceNotFound) as info:
                await pool.read_resource("r://gone", server="s")
            assert info.value.code == -32602 and info.value.uri == "r://gone"
            with trio.fail_after(10), pytest.raises(McpProtocolError, match="sampling/createMessage"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
    call = next(r for r in fake.requests if r.rpc_method == "tools/call")
    assert call.headers["mcp-name"] == "t"
    assert "DELETE" not in fake.methods() and "GET" not in fake.methods()


async def test_refusal_without_a_modern_discover_is_the_connect_error() -> None:
    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "initialize":
            await resp.json(error(req, -32602, "bad params"), status=400)
        else:
            await resp.json(error(req, -32601, "no such method"), status=404)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        with trio.fail_after(10), pytest.raises(McpConnectError, match="server/discover failed too"):
            async with open_mcp_pool([server(fake.url)], log=Events().log):
                pass
        nursery.cancel_scope.cancel()


async def test_listen_refused_degrades_and_is_retried(autojump_clock: trio.abc.Clock) -> None:
    async def refuse(req: Req, resp: Resp) -> None:
        await resp.json(error(req, -32601, "no listen"), status=404)

    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, modern_peer(listen=refuse))
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            assert await pool.subscribe("r://x") is False
            await trio.sleep(60)
            assert pool.connections["s"].connected
        nursery.cancel_scope.cancel()
    assert fake.methods().count("subscriptions/listen") >= 4  # retried with backoff
    assert events.named("mcp.subscribe_degraded")


async def test_listen_ack_filters_foreign_frames_and_drop_synthesizes(autojump_clock: trio.abc.Clock) -> None:
    opened: list[dict[str, Any]] = []

    async def listen(req: Req, resp: Resp) -> None:
        rid = req.json["id"]
        params = req.json["params"]["notifications"]
        opened.append(params)
        await resp.start(200, {"content-type": "text/event-stream"})
        ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
               "params": {"_meta": {SUB_ID: rid}, "notifications": params}}
        await resp.write(encode_event(json.dumps(ack)))
        for sid in (rid, "someone-else"):
            for uri in params.get("resourceSubscriptions", []):
                note = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                        "params": {"_meta": {SUB_ID: sid}, "uri": uri}}
                await resp.write(encode_event(json.dumps(note)))
        if len(opened) == 2:
            await resp.end()  # abrupt: no final result frame
            return
        await trio.sleep_forever()

    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, modern_peer(listen=listen))
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            updates = pool.updates()
            assert await pool.subscribe("r://x")
            with trio.fail_after(30):
                first = await updates.receive()
                second = await updates.receive()
            assert (first.uri, first.synthesized) == ("r://x", False)  # the foreign frame was ignored
            # The second listen ended abruptly: re-listen, then one synthesized update (which the coalescing
            # queue may merge with the new listen's real one).
            assert second.uri == "r://x"
            with trio.move_on_after(5):
                while True:
                    await updates.receive()
        nursery.cancel_scope.cancel()
    assert opened[0] == {"toolsListChanged": True}
    assert opened[1] == {"toolsListChanged": True, "resourceSubscriptions": ["r://x"]}
    assert len(opened) == 3
    synthesized = [e for e in events.named("mcp.updated") if e["synthesized"]]
    assert len(synthesized) == 1


async def test_get_that_never_answers_does_not_stall_connect(autojump_clock: trio.abc.Clock) -> None:
    async def handler(req: Req, resp: Resp) -> None:
        if req.method == "GET":
            await trio.sleep_forever()
        await mcp_answer(req, resp, init={**INIT_RESULT, "capabilities": {"tools": {"listChanged": True}}})

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        start = trio.current_time()
        async with open_mcp_pool([server(fake.url, connect_timeout=5.0)], log=Events().log) as pool:
            assert trio.current_time() - start == pytest.approx(5.0, abs=0.5)
            assert (await pool.call_tool("s", "t", {})).content[0]["text"] == "ok"
        nursery.cancel_scope.cancel()


async def test_reconnect_to_a_known_modern_server_skips_initialize(autojump_clock: trio.abc.Clock) -> None:
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, modern_peer())
        port = int(fake.url.split(":")[2].split("/")[0])
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            fake.stop()
            with pytest.raises(McpTransportError):  # refused, or not connected (reconnecting)
                await pool.call_tool("s", "t", {})
            revived = await nursery.start(serve_fake, modern_peer(), port)
            with trio.fail_after(60):
                while len(events.named("mcp.connected")) < 2:
                    await trio.sleep(0.5)
            assert pool.connections["s"].era is Era.MODERN and pool.connections["s"].connected
        nursery.cancel_scope.cancel()
    assert fake.methods()[:2] == ["initialize", "server/discover"]
    assert revived.methods()[0] == "server/discover" and "initialize" not in revived.methods()


async def test_x_mcp_header_arguments_are_mirrored_and_invalid_tools_dropped() -> None:
    tools = {"tools": [
        {"name": "deploy", "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
            "note": {"type": "string", "x-mcp-header": "Note"},
            "count": {"type": "integer"}}}},
        {"name": "bad_number", "inputSchema": {"type": "object", "properties": {
            "ratio": {"type": "number", "x-mcp-header": "Ratio"}}}},
        {"name": "bad_dup", "inputSchema": {"type": "object", "properties": {
            "a": {"type": "string", "x-mcp-header": "X"}, "b": {"type": "string", "x-mcp-header": "x"}}}},
    ]}
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, modern_peer(overrides={"tools/list": tools}))
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            assert [t.name for t in pool.tools()] == ["deploy"]
            with trio.fail_after(10):
                await pool.call_tool("s", "deploy", {"region": "eu-west", "dry": True, "note": "héllo", "count": 3})
        nursery.cancel_scope.cancel()
    call = next(r for r in fake.requests if r.rpc_method == "tools/call")
    assert call.headers["mcp-param-region"] == "eu-west"
    assert call.headers["mcp-param-dry-run"] == "true"
    assert call.headers["mcp-param-note"].startswith("=?base64?")
    assert not any(h.startswith("mcp-param-count") for h in call.headers)
    dropped = [e["what"] for e in events.named("mcp.protocol_error") if "dropped" in e["what"]]
    assert len(dropped) == 2


async def test_header_mismatch_relists_tools_and_retries_once() -> None:
    state = {"calls": 0, "lists": 0}
    base = modern_peer()

    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "tools/list":
            state["lists"] += 1
            schema = {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "Region"}}}
            tools = [{"name": "t", "inputSchema": schema if state["lists"] > 1 else {"type": "object"}}]
            await resp.json(result(req, {"tools": tools}))
        elif req.rpc_method == "tools/call":
            state["calls"] += 1
            if "mcp-param-region" not in req.headers:
                await resp.json(error(req, -32020, "Mcp-Param-Region missing"), status=400)
            else:
                await resp.json(result(req, {"content": [{"type": "text", "text": "ok"}]}))
        else:
            await base(req, resp)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10):
                res = await pool.call_tool("s", "t", {"r": "eu"})
            assert res.content[0]["text"] == "ok"
        nursery.cancel_scope.cancel()
    assert state == {"calls": 2, "lists": 2}
