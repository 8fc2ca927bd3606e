"""The 2026-07-28 wire against a modern-only peer: detection after a refused initialize, the envelope and
headers, discover, paging, calls, not-found, listen subscriptions, drops, and cancellation by closing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from agentd.client import Tuning, open_mcp_pool
from agentd.errors import McpRpcError, ResourceNotFound
from agentd.mcp.versions import Era
from tests.client.helpers import Events, server
from tests.peers import launch
from tests.waiting import until

pytestmark = pytest.mark.interop


@pytest.fixture
def fresh_modern() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(launch.modern_server_argv(tools=12, page_size=5)) as peer:
        yield peer


async def test_modern_only_server_is_detected_and_spoken_to(modern_server: launch.PeerProcess) -> None:
    events = Events()
    async with open_mcp_pool([server(modern_server.url, "m")], log=events.log, run_id="r-m") as pool:
        conn = pool.connections["m"]
        assert conn.era is Era.MODERN and conn.protocol_version == "2026-07-28"
        assert conn.session_id is None
        assert conn.server_info is not None and conn.server_info.name == "agentd-modern-test-peer"
        assert pool.instructions() == {"m": "Modern-only test peer."}
        names = [t.name for t in pool.tools()]
        assert len([n for n in names if n.startswith("filler")]) == 12  # drained across pages of 5
        with trio.fail_after(20):
            res = await pool.call_tool("m", "echo", {"text": "modern"})
            assert res.content[0]["text"] == "modern" and res.is_error is False
            read = await pool.read_resource(pool.resources()[0].uri)
            assert read.contents
            with pytest.raises(ResourceNotFound) as info:
                await pool.read_resource("test://nowhere", server="m")
            assert info.value.uri == "test://nowhere" and info.value.code in (-32002, -32602)
            with pytest.raises(McpRpcError):
                await pool.call_tool("m", "no_such_tool", {})
    era = events.named("mcp.era")
    assert [(e["era"], e["protocol_version"]) for e in era] == [("modern", "2026-07-28")]
    stats = launch.stats(modern_server.url)["requests"]
    assert stats.get("server/discover", 0) >= 1
    assert "ping" not in stats and "resources/subscribe" not in stats


async def test_listen_delivers_updates_and_drops_synthesize(fresh_modern: launch.PeerProcess) -> None:
    url = fresh_modern.url
    events = Events()
    async with open_mcp_pool([server(url, "m")], log=events.log, tuning=Tuning(backoff_initial=0.1)) as pool:
        updates = pool.updates()
        with trio.fail_after(20):
            assert await pool.subscribe("test://counter")
            await launch.abump(url, "test://counter")
            update = await updates.receive()
            assert (update.uri, update.synthesized) == ("test://counter", False)
            # An abrupt drop: re-listen, then exactly one synthesized update.
            await trio.to_thread.run_sync(launch._side_door, url, "/_test/drop_listens")
            update = await updates.receive()
            assert (update.uri, update.synthesized) == ("test://counter", True)
            # The new listen is live.
            await launch.abump(url, "test://counter")
            update = await updates.receive()
            assert (update.uri, update.synthesized) == ("test://counter", False)
            # tools/list_changed over listen refreshes the catalogue.
            name = await trio.to_thread.run_sync(launch.add_tool, url, "late_tool")
            await until(lambda: name in [t.name for t in pool.tools()], timeout=20, what="the new tool listed")
            # A graceful end (final frame) re-listens without synthesizing anything.
            def acks() -> int:
                return len([e for e in events.named("mcp.stream") if e.get("listen") == "acknowledged"])

            before = acks()
            await trio.to_thread.run_sync(launch._side_door, url, "/_test/close_listens")
            await until(lambda: acks() != before, timeout=20, what="the re-listen acknowledged")
            await launch.abump(url, "test://counter")
            update = await updates.receive()
            assert (update.uri, update.synthesized) == ("test://counter", False)
    assert len([e for e in events.named("mcp.updated") if e["synthesized"]]) == 1
    assert launch.stats(url)["listens"] == 0  # every listen was closed on exit


async def test_abandoning_a_call_closes_its_stream(fresh_modern: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(fresh_modern.url, "m")], log=Events().log) as pool:
        with trio.move_on_after(0.5):
            await pool.call_tool("m", "slow", {"seconds": 30})
        await until(lambda: trio.to_thread.run_sync(launch.cancelled, fresh_modern.url), timeout=10,
                    what="the peer recorded the cancel")
    record = launch.cancelled(fresh_modern.url)[-1]
    assert record["via"] == "disconnect" and record["method"] == "tools/call"
    assert "notifications/cancelled" not in launch.stats(fresh_modern.url)["requests"]
