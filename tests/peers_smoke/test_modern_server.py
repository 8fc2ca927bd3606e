"""The modern-only peer enforces the 2026-07-28 wire rules the client must follow."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.peers import launch
from tests.peers.rawclient import (
    ACCEPT,
    RpcError,
    modern_envelope,
    modern_headers,
    modern_request,
    read_sse_until,
)
from tests.waiting import until

pytestmark = pytest.mark.interop
SUB = "io.modelcontextprotocol/subscriptionId"


async def test_initialize_is_rejected_with_supported_versions(modern_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(10):
            resp = await client.post(modern_server.url, headers={"Accept": ACCEPT}, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x"}}})
            get = await client.get(modern_server.url, headers={"Accept": "text/event-stream"})
            delete = await client.delete(modern_server.url)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == -32022 and error["data"]["supported"] == ["2026-07-28"]
    assert get.status_code == 405 and get.headers["allow"] == "POST"
    assert delete.status_code == 405


async def test_discover_list_call_read(modern_server: launch.PeerProcess) -> None:
    url = modern_server.url
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(10):
            discover = await modern_request(client, url, "server/discover")
            names: list[str] = []
            cursor = None
            pages = 0
            while True:
                page = await modern_request(client, url, "tools/list", {"cursor": cursor} if cursor else {})
                pages += 1
                names += [t["name"] for t in page["tools"]]
                cursor = page.get("nextCursor")
                if not cursor:
                    break
            add = await modern_request(client, url, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}},
                                       name="add")
            static = await modern_request(client, url, "resources/read", {"uri": "test://static"},
                                          name="test://static")
            with pytest.raises(RpcError) as missing:
                await modern_request(client, url, "resources/read", {"uri": "test://nope"}, name="test://nope")
    assert discover["supportedVersions"] == ["2026-07-28"] and discover["resultType"] == "complete"
    assert discover["capabilities"]["resources"]["subscribe"] is True
    assert pages == 4 and len(names) == 17  # 5 fixed tools (incl. the test-only break_stream) + 12 fillers
    assert add["structuredContent"] == {"sum": 3} and add["resultType"] == "complete"
    assert "io.modelcontextprotocol/serverInfo" in add["_meta"]
    assert static["contents"][0]["text"] == "static text" and static["ttlMs"] == 0
    assert missing.value.code == -32602


async def test_envelope_and_header_rules(modern_server: launch.PeerProcess) -> None:
    url = modern_server.url
    body = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x"}, "_meta": modern_envelope()}}
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(10):
            no_name = await client.post(url, headers=modern_headers("tools/call"), json=body)
            wrong_method = await client.post(url, headers=modern_headers("tools/list", "echo"), json=body)
            b64 = await client.post(url, headers=modern_headers("tools/call", "=?base64?ZWNobw==?="), json=body)
            no_meta = await client.post(url, headers=modern_headers("tools/call", "echo"),
                                        json={**body, "params": {"name": "echo", "arguments": {}}})
            old = await client.post(url, headers=modern_headers("tools/call", "echo", version="2025-11-25"), json={
                **body, "params": {**body["params"], "_meta": modern_envelope("2025-11-25")}})
            unknown = await client.post(url, headers=modern_headers("ping"), json={
                "jsonrpc": "2.0", "id": 6, "method": "ping", "params": {"_meta": modern_envelope()}})
            note = await client.post(url, headers=modern_headers("notifications/x"), json={
                "jsonrpc": "2.0", "method": "notifications/x"})
    assert no_name.status_code == 400 and no_name.json()["error"]["code"] == -32020
    assert wrong_method.status_code == 400 and wrong_method.json()["error"]["code"] == -32020
    assert b64.status_code == 200 and b64.json()["result"]["content"][0]["text"] == "x"
    assert no_meta.status_code == 400 and no_meta.json()["error"]["code"] == -32602
    assert old.status_code == 400 and old.json()["error"]["code"] == -32022
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == -32601
    assert note.status_code == 202


async def test_listen_ack_updates_and_graceful_close() -> None:
    async with launch.peer_server(launch.modern_server_argv()) as peer:
        body = {"jsonrpc": "2.0", "id": "L1", "method": "subscriptions/listen", "params": {
            "_meta": modern_envelope(),
            "notifications": {"toolsListChanged": True, "promptsListChanged": True,
                              "resourceSubscriptions": ["test://counter"]}}}
        async with httpx.AsyncClient(timeout=10) as client:
            with trio.fail_after(15):
                async with client.stream("POST", peer.url, headers=modern_headers("subscriptions/listen"),
                                         json=body) as stream:
                    assert stream.headers["content-type"].startswith("text/event-stream")
                    async with trio.open_nursery() as nursery:
                        async def listening() -> bool:
                            return bool((await trio.to_thread.run_sync(launch.stats, peer.url))["listens"])

                        async def poke() -> None:
                            await until(listening, timeout=15, what="the listen registered")
                            await launch.abump(peer.url)
                            await launch.abump(peer.url, "test://other")  # not subscribed: never delivered
                            await trio.to_thread.run_sync(launch.add_tool, peer.url, "late")
                            # real time: the notifications go out on the real stream before it is closed
                            await trio.sleep(0.2)
                            await trio.to_thread.run_sync(launch._side_door, peer.url, "/_test/close_listens")
                        nursery.start_soon(poke)
                        seen = await read_sse_until(stream, lambda m: "result" in m)
    ack = seen[0]
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"toolsListChanged": True, "resourceSubscriptions": ["test://counter"]}
    assert all(m["params" if "method" in m else "result"]["_meta"][SUB] == "L1" for m in seen)
    methods = [m.get("method") for m in seen[1:-1]]
    assert methods == ["notifications/resources/updated", "notifications/tools/list_changed"]
    assert seen[1]["params"]["uri"] == "test://counter"
    assert seen[-1] == {"jsonrpc": "2.0", "id": "L1", "result": {"resultType": "complete", "_meta": {SUB: "L1"}}}


async def test_closing_the_response_cancels_the_call() -> None:
    async with launch.peer_server(launch.modern_server_argv()) as peer:
        async with httpx.AsyncClient(timeout=10) as client:
            with trio.fail_after(10):
                with trio.move_on_after(0.3):
                    await modern_request(client, peer.url, "tools/call",
                                         {"name": "slow", "arguments": {"seconds": 30}}, name="slow")
                recorded = await until(lambda: trio.to_thread.run_sync(launch.cancelled, peer.url), timeout=10,
                                       what="the disconnect recorded as a cancel")
    assert recorded[0]["via"] == "disconnect" and recorded[0]["method"] == "tools/call"


async def test_listen_keepalive_and_abrupt_drop() -> None:
    async with launch.peer_server([*launch.modern_server_argv(), "--keepalive", "0.1"]) as peer:
        body = {"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": {
            "_meta": modern_envelope(), "notifications": {"resourcesListChanged": True}}}
        async with httpx.AsyncClient(timeout=10) as client:
            with trio.fail_after(15):
                async with client.stream("POST", peer.url, headers=modern_headers("subscriptions/listen"),
                                         json=body) as stream:
                    raw = ""
                    dropped = False
                    async for chunk in stream.aiter_text():  # one iterator: leaving it would close the stream
                        raw += chunk
                        if raw.count(": ping") >= 2 and not dropped:
                            stats = await trio.to_thread.run_sync(launch.stats, peer.url)
                            assert stats["listens"] == 1
                            await trio.to_thread.run_sync(launch._side_door, peer.url, "/_test/drop_listens")
                            dropped = True
        assert dropped
        assert '"io.modelcontextprotocol/subscriptionId":9' in raw and '"resourcesListChanged":true' in raw
        assert '"result"' not in raw  # abrupt: no final result frame
        async def no_listens() -> bool:
            return not (await trio.to_thread.run_sync(launch.stats, peer.url))["listens"]

        await until(no_listens, timeout=5, what="the dropped listen gone")
