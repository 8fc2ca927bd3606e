"""The official-SDK 2.x peer does what the other suites rely on, checked on the wire with a raw client."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import trio

from tests.peers import launch
from tests.peers.rawclient import (
    LegacySession,
    RpcError,
    SseReader,
    modern_envelope,
    modern_headers,
    modern_request,
    poke_until_seen,
)
from tests.waiting import until

pytestmark = pytest.mark.interop


def is_update(message: dict) -> bool:
    return message.get("method") == "notifications/resources/updated"


@pytest.fixture(scope="module")
def mutable_peer():
    """One peer for the tests that mutate state; each uses its own counter URI / request id."""
    with launch.start_peer(launch.sdk_server_argv()) as peer:
        yield peer


async def _session(client: httpx.AsyncClient, url: str) -> LegacySession:
    s = LegacySession(client, url)
    await s.initialize()
    return s


async def test_legacy_handshake_capabilities_and_instructions(sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(10):
            s = await _session(client, sdk_server.url)
    init = s.init_result
    assert init["protocolVersion"] == "2025-11-25"
    assert s.session_id
    assert init["capabilities"]["tools"] == {"listChanged": True}
    assert init["capabilities"]["resources"]["subscribe"] is True
    assert init["capabilities"]["resources"]["listChanged"] is True
    assert init["instructions"] == "Test peer instructions."


async def test_tools_list_is_really_paginated(sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(10):
            s = await _session(client, sdk_server.url)
            first = await s.request("tools/list", {})
            tools, pages = await s.list_all("tools/list", "tools")
            with pytest.raises(RpcError) as bad:
                await s.request("tools/list", {"cursor": "not-a-cursor"})
    assert len(first["tools"]) == 10 and first["nextCursor"]
    names = [t["name"] for t in tools]
    assert pages == 5 and len(names) == 47 == len(set(names))
    assert names[:7] == ["echo", "add", "fail", "bad_structured", "slow", "bump", "add_tool"]
    add = next(t for t in tools if t["name"] == "add")
    assert add["outputSchema"]["required"] == ["sum"]
    assert bad.value.code == -32602


async def test_fixed_tools(sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(10):
            s = await _session(client, sdk_server.url)
            echo = await s.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
            add = await s.request("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}})
            fail = await s.request("tools/call", {"name": "fail", "arguments": {"message": "boom"}})
            bad = await s.request("tools/call", {"name": "bad_structured", "arguments": {}})
            slow = await s.request("tools/call", {"name": "slow", "arguments": {"seconds": 0.01}})
            with pytest.raises(RpcError):
                await s.request("tools/call", {"name": "nope", "arguments": {}})
    assert echo["content"] == [{"type": "text", "text": "hi"}] and echo["isError"] is False
    assert add["structuredContent"] == {"sum": 5} and add["content"][0]["text"] == "5"
    assert fail["isError"] is True and fail["content"][0]["text"] == "boom"
    assert bad["structuredContent"] == {"value": "not-an-integer"}
    assert slow["content"][0]["text"] == "slept 0.01"


async def test_resources(sdk_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(10):
            s = await _session(client, sdk_server.url)
            resources, _ = await s.list_all("resources/list", "resources")
            templates = await s.request("resources/templates/list", {})
            static = await s.request("resources/read", {"uri": "test://static"})
            blob = await s.request("resources/read", {"uri": "test://blob"})
            item = await s.request("resources/read", {"uri": "test://item/42"})
            with pytest.raises(RpcError) as missing:
                await s.request("resources/read", {"uri": "test://missing"})
    assert {r["uri"] for r in resources} >= {"test://static", "test://blob", "test://counter"}
    assert templates["resourceTemplates"][0]["uriTemplate"] == "test://item/{id}"
    assert static["contents"][0]["text"] == "static text"
    assert base64.b64decode(blob["contents"][0]["blob"]) == bytes(range(256))
    assert item["contents"][0]["text"] == "item 42"
    assert missing.value.code == -32002 and missing.value.error["data"] == {"uri": "test://missing"}


@pytest.mark.parametrize("mode", ["json", "stateless"])
async def test_json_modes_answer_with_json(sdk_server_factory, mode: str) -> None:
    peer = sdk_server_factory(mode=mode, tools=3, page_size=2)
    async with httpx.AsyncClient() as client:
        with trio.fail_after(10):
            s = await _session(client, peer.url)
            resp = await client.post(peer.url, headers=s.headers(), json={
                "jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "j"}}})
            tools, pages = await s.list_all("tools/list", "tools")
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["result"]["content"][0]["text"] == "j"
    assert (s.session_id is None) == (mode == "stateless")
    assert len(tools) == 10 and pages == 5


async def test_legacy_subscription_via_get_stream_and_side_door(mutable_peer) -> None:
    peer = mutable_peer
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            s = await _session(client, peer.url)
            await s.request("resources/subscribe", {"uri": "test://counter-a"})
            headers = {"Accept": "text/event-stream", "Mcp-Session-Id": s.session_id or "",
                       "MCP-Protocol-Version": "2025-11-25"}
            async with client.stream("GET", peer.url, headers=headers) as stream:
                assert stream.status_code == 200
                sse = SseReader(stream)
                seen = await poke_until_seen(sse, lambda: launch.abump(peer.url, "test://counter-a"), is_update)
                assert await trio.to_thread.run_sync(launch.add_tool, peer.url, "late_tool") == "late_tool"
                seen += await sse.until(lambda m: m.get("method") == "notifications/tools/list_changed")
            counter = await s.request("resources/read", {"uri": "test://counter-a"})
            tools, _ = await s.list_all("tools/list", "tools")
    updates = [m for m in seen if m.get("method") == "notifications/resources/updated"]
    assert updates and updates[0]["params"]["uri"] == "test://counter-a"
    assert json.loads(counter["contents"][0]["text"]) >= 1
    assert "late_tool" in {t["name"] for t in tools}


async def test_bump_tool_notifies_other_session(mutable_peer) -> None:
    peer = mutable_peer
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            watcher = await _session(client, peer.url)
            actor = await _session(client, peer.url)
            await watcher.request("resources/subscribe", {"uri": "test://counter-b"})
            headers = {"Accept": "text/event-stream", "Mcp-Session-Id": watcher.session_id or "",
                       "MCP-Protocol-Version": "2025-11-25"}
            values: list[int] = []

            async def poke() -> None:
                result = await actor.request("tools/call", {"name": "bump", "arguments": {"uri": "test://counter-b"}})
                values.append(result["structuredContent"]["value"])

            async with client.stream("GET", peer.url, headers=headers) as stream:
                seen = await poke_until_seen(stream, poke, is_update)
    assert values == list(range(1, len(values) + 1))  # the bump tool counts up from 1
    assert seen[-1]["params"]["uri"] == "test://counter-b"


async def test_cancellation_is_recorded(mutable_peer) -> None:
    peer = mutable_peer
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            s = await _session(client, peer.url)
            async with trio.open_nursery() as nursery:
                async def call() -> None:
                    with pytest.raises(Exception):
                        await s.request("tools/call", {"name": "slow", "arguments": {"seconds": 30}}, id=77)
                nursery.start_soon(call)
                # A cancel that overtakes its request is ignored by the server: repeat until it lands.
                while not any(c["requestId"] == 77 for c in launch.cancelled(peer.url)):
                    await s.notify("notifications/cancelled", {"requestId": 77, "reason": "test says stop"})
                    await trio.sleep(0.3)  # real time: give the real server's answer to each try a moment
                nursery.cancel_scope.cancel()
            resource = await s.request("resources/read", {"uri": "test://cancelled"})
    recorded = [c for c in json.loads(resource["contents"][0]["text"]) if c["requestId"] == 77]
    assert recorded == [{"requestId": 77, "reason": "test says stop", "via": "notification"}]


async def test_modern_era_discover_and_listen(mutable_peer) -> None:
    peer = mutable_peer
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            discover = await modern_request(client, peer.url, "server/discover")
            call = await modern_request(client, peer.url, "tools/call", {"name": "echo", "arguments": {"text": "m"}},
                                        name="echo")
            body = {"jsonrpc": "2.0", "id": "L1", "method": "subscriptions/listen", "params": {
                "_meta": modern_envelope(),
                "notifications": {"toolsListChanged": True, "resourceSubscriptions": ["test://counter-c"]}}}
            async with client.stream("POST", peer.url, headers=modern_headers("subscriptions/listen"),
                                     json=body) as stream:
                assert stream.status_code == 200
                # The ack is the first frame and the SDK subscribes before sending it: one bump is enough.
                sse = SseReader(stream)
                seen = await sse.until(lambda m: "subscriptions/acknowledged" in m.get("method", ""))
                await launch.abump(peer.url, "test://counter-c")
                seen += await sse.until(is_update)
    assert "2026-07-28" in discover["supportedVersions"]
    assert call["resultType"] == "complete" and call["content"][0]["text"] == "m"
    assert seen[0]["method"] == "notifications/subscriptions/acknowledged"
    assert seen[-1]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
    assert seen[-1]["params"]["uri"] == "test://counter-c"


async def test_modern_disconnect_cancels_slow_call(mutable_peer) -> None:
    peer = mutable_peer
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            with trio.move_on_after(0.5):
                await modern_request(client, peer.url, "tools/call", {"name": "slow", "arguments": {"seconds": 31}},
                                     name="slow")
            found = await until(lambda: [c for c in launch.cancelled(peer.url) if c["via"] == "disconnect"],
                                timeout=15, what="the disconnect recorded as a cancel")
    [entry] = found
    assert entry["via"] == "disconnect" and entry["reason"] is None
