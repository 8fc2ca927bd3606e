"""Interop with the official MCP Python SDK 2.x server in its stateful, stateless and JSON-response modes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpProtocolError, McpRpcError, ResourceNotFound
from tests.client.helpers import Events, server
from tests.peers import launch
from tests.waiting import until

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module", params=["stateful", "stateless", "json"])
def peer(request: pytest.FixtureRequest) -> Iterator[launch.PeerProcess]:
    argv = launch.sdk_server_argv(mode=request.param, tools=40, page_size=10, instructions="Test peer instructions.")
    with launch.start_peer(argv) as p:
        p.mode = request.param  # type: ignore[attr-defined]
        yield p


async def test_handshake_catalogue_and_paging(peer: launch.PeerProcess) -> None:
    events = Events()
    async with open_mcp_pool([server(peer.url, "sdk")], log=events.log) as pool:
        conn = pool.connections["sdk"]
        assert conn.era is not None and conn.era.value == "legacy"
        assert conn.protocol_version == "2025-11-25"
        assert conn.server_info is not None and conn.server_info.name == "agentd-test-peer"
        assert pool.instructions() == {"sdk": "Test peer instructions."}
        names = [t.name for t in pool.tools()]
        assert len(names) == 47 and len(set(names)) == 47  # 5 pages of 10
        assert names[:3] == ["echo", "add", "fail"] and names[-1] == "filler_0039"
        add = next(t for t in pool.tools() if t.name == "add")
        assert add.output_schema is not None and add.input_schema["required"] == ["a", "b"]
        assert [r.uri for r in pool.resources()] == ["test://static", "test://blob", "test://counter",
                                                      "test://cancelled"]
        assert [t.uri_template for t in pool.resource_templates()] == ["test://item/{id}"]
        if peer.mode == "stateless":  # type: ignore[attr-defined]
            assert conn.session_id is None
        else:
            assert conn.session_id
    # Paging requests, visible in the peer's counters.
    assert launch.stats(peer.url)["requests"]["tools/list"] >= 5


async def test_is_error_vs_jsonrpc_error_and_structured_content(peer: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(peer.url, "sdk")], log=Events().log, run_id="r-1") as pool:
        with trio.fail_after(20):
            ok = await pool.call_tool("sdk", "add", {"a": 2, "b": 3})
            assert (ok.is_error, ok.structured, ok.content) == (False, {"sum": 5}, [{"type": "text", "text": "5"}])
            failed = await pool.call_tool("sdk", "fail", {"message": "nope"})
            assert failed.is_error and failed.content[0]["text"] == "nope"
            with pytest.raises(McpRpcError) as info:
                await pool.call_tool("sdk", "no_such_tool", {})
            assert info.value.code == -32602 and info.value.method == "tools/call"
            with pytest.raises(McpProtocolError, match="outputSchema"):
                await pool.call_tool("sdk", "bad_structured", {})
            echo = await pool.call_tool("sdk", "echo", {"text": "héllo"})
            assert echo.content[0]["text"] == "héllo"


async def test_resources_read_text_blob_and_not_found(peer: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(peer.url, "sdk")], log=Events().log) as pool:
        with trio.fail_after(20):
            static = await pool.read_resource("test://static")
            assert static.contents == [{"uri": "test://static", "mimeType": "text/plain", "text": "static text"}]
            blob = await pool.read_resource("test://blob", server="sdk")
            import base64

            assert base64.b64decode(blob.contents[0]["blob"]) == bytes(range(256))
            item = await pool.read_resource("test://item/42")  # unlisted, from a template
            assert item.contents[0]["text"] == "item 42"
            with pytest.raises(ResourceNotFound) as info:
                await pool.read_resource("test://missing")
            assert info.value.uri == "test://missing" and info.value.code == -32002


async def test_subscribe_and_updated_notify_then_read(peer: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(peer.url, "sdk")], log=Events().log) as pool:
        if peer.mode == "stateless":  # type: ignore[attr-defined]
            # No session: nothing could route an update to us, so the subscription degrades (the caller polls).
            assert await pool.subscribe("test://counter") is False
            return
        with trio.fail_after(20):
            assert await pool.subscribe("test://counter")
            before = int((await pool.read_resource("test://counter")).contents[0]["text"])
            await launch.abump(peer.url, "test://counter")
            update = await pool.updates().receive()
            assert (update.server, update.uri, update.synthesized) == ("sdk", "test://counter", False)
            after = int((await pool.read_resource("test://counter")).contents[0]["text"])
            assert after == before + 1
            await pool.unsubscribe("test://counter")


# A stateless server has no session to deliver list_changed on, nor to route notifications/cancelled to the
# request it names: these two behaviours exist only with a session.
WITH_SESSION = pytest.mark.parametrize("peer", ["stateful", "json"], indirect=True)


@WITH_SESSION
async def test_tools_list_changed_refreshes_the_catalogue(peer: launch.PeerProcess) -> None:
    events = Events()
    async with open_mcp_pool([server(peer.url, "sdk")], log=events.log) as pool:
        before = len(pool.tools())
        name = await trio.to_thread.run_sync(launch.add_tool, peer.url, None)
        await until(lambda: name in [t.name for t in pool.tools()], timeout=20, what="the new tool listed")
        assert len(pool.tools()) == before + 1
    assert events.named("mcp.list_changed")[0]["advertised"] is True


@WITH_SESSION
async def test_abandoned_call_is_cancelled_on_the_server(peer: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(peer.url, "sdk")], log=Events().log) as pool:
        with trio.move_on_after(0.5):
            await pool.call_tool("sdk", "slow", {"seconds": 30})
        await until(lambda: launch.cancelled(peer.url), timeout=10, what="the peer recorded the cancel")
    record = launch.cancelled(peer.url)[-1]
    assert record["via"] == "notification" and record["reason"] == "the request was cancelled"
