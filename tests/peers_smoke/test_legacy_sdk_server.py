"""The 1.x-era FastMCP peer (``mcp<2``) serves the same fixtures as the 2.x peer, handshake era only."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import trio

from tests.peers import launch
from tests.peers.rawclient import LegacySession, RpcError, SseReader, modern_request, poke_until_seen

pytestmark = pytest.mark.interop


async def _session(client: httpx.AsyncClient, url: str) -> LegacySession:
    s = LegacySession(client, url)
    await s.initialize()
    return s


async def test_handshake_paging_and_tools(legacy_sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            s = await _session(client, legacy_sdk_server.url)
            tools, pages = await s.list_all("tools/list", "tools")
            echo = await s.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
            add = await s.request("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}})
            fail = await s.request("tools/call", {"name": "fail", "arguments": {"message": "boom"}})
            bad = await s.request("tools/call", {"name": "bad_structured", "arguments": {}})
    caps = s.init_result["capabilities"]
    assert s.init_result["protocolVersion"] == "2025-11-25"
    assert caps["tools"]["listChanged"] is True and caps["resources"]["subscribe"] is True
    names = [t["name"] for t in tools]
    assert pages == 3 and len(names) == 22 == len(set(names))
    assert {"echo", "add", "fail", "bad_structured", "slow", "bump", "add_tool"} <= set(names)
    assert next(t for t in tools if t["name"] == "add")["outputSchema"]["properties"]["sum"]["type"] == "integer"
    assert echo["content"][0]["text"] == "hi"
    assert add["structuredContent"] == {"sum": 5}
    assert fail["isError"] is True and fail["content"][0]["text"] == "boom"
    assert bad["structuredContent"] == {"value": "not-an-integer"}


async def test_resources(legacy_sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            s = await _session(client, legacy_sdk_server.url)
            resources, pages = await s.list_all("resources/list", "resources")
            static = await s.request("resources/read", {"uri": "test://static"})
            blob = await s.request("resources/read", {"uri": "test://blob"})
            item = await s.request("resources/read", {"uri": "test://item/7"})
            with pytest.raises(RpcError) as missing:
                await s.request("resources/read", {"uri": "test://missing"})
    assert len(resources) == 4 and pages == 1
    assert static["contents"][0]["text"] == "static text"
    assert base64.b64decode(blob["contents"][0]["blob"]) == bytes(range(256))
    assert item["contents"][0]["text"] == "item 7"
    assert missing.value.code == -32002 and missing.value.error["data"] == {"uri": "test://missing"}


async def test_rejects_modern_requests(legacy_sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(10), pytest.raises(RpcError) as err:
            await modern_request(client, legacy_sdk_server.url, "server/discover")
    assert err.value.status == 400 and err.value.code == -32600


async def test_subscription_cancel_and_list_changed() -> None:
    async with launch.peer_server(launch.legacy_sdk_server_argv()) as peer:
        async with httpx.AsyncClient(timeout=10) as client:
            with trio.fail_after(20):
                s = await _session(client, peer.url)
                await s.request("tools/list", {})
                await s.request("resources/subscribe", {"uri": "test://counter"})
                headers = {"Accept": "text/event-stream", "Mcp-Session-Id": s.session_id or "",
                           "MCP-Protocol-Version": "2025-11-25"}
                async with client.stream("GET", peer.url, headers=headers) as stream:
                    sse = SseReader(stream)
                    seen = await poke_until_seen(
                        sse, lambda: launch.abump(peer.url),
                        lambda m: m.get("method") == "notifications/resources/updated")
                    await trio.to_thread.run_sync(launch.add_tool, peer.url, "late")
                    seen += await sse.until(lambda m: m.get("method") == "notifications/tools/list_changed")
                async with trio.open_nursery() as nursery:
                    async def call() -> None:
                        with pytest.raises(Exception):
                            await s.request("tools/call", {"name": "slow", "arguments": {"seconds": 30}}, id=55)
                    nursery.start_soon(call)
                    # A cancel that overtakes its request is ignored by the server: repeat until it lands.
                    while not (recorded := launch.cancelled(peer.url)):
                        await s.notify("notifications/cancelled", {"requestId": 55, "reason": "enough"})
                        await trio.sleep(0.3)  # real time: give the real server's answer to each try a moment
                    nursery.cancel_scope.cancel()
                counter = await s.request("resources/read", {"uri": "test://counter"})
    assert any(m.get("method") == "notifications/resources/updated" and m["params"]["uri"] == "test://counter"
               for m in seen)
    assert json.loads(counter["contents"][0]["text"]) >= 1
    assert recorded == [{"requestId": 55, "reason": "enough", "via": "notification"}]
