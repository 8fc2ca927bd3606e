"""2026-07-28 has no resumability: a response stream that breaks before its answer is re-issued once under a
new id for side-effect-free requests (discover, lists, reads, listen) and surfaced typed for ``tools/call``.
The modern-only peer breaks streams on request (``/_test/break_next``, tool ``break_stream``, resource
``test://broken``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from agentd.client import EraCache, ResponseStreamBroken, Tuning, open_mcp_pool
from agentd.errors import McpTransportError
from tests.client.helpers import Events, server
from tests.peers import launch
from tests.waiting import until

pytestmark = pytest.mark.interop


@pytest.fixture
def peer() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(launch.modern_server_argv(tools=12, page_size=5)) as p:
        yield p


def reissues(events: Events) -> list[dict[str, object]]:
    return [e for e in events.named("mcp.stream") if e.get("reissued") or e.get("listen") == "reissued"]


async def test_connect_reissues_broken_discover_and_list_pages(peer: launch.PeerProcess) -> None:
    url = peer.url
    launch.break_next(url, "server/discover")
    launch.break_next(url, "tools/list", how="end")  # a clean close before the answer is broken too
    launch.break_next(url, "resources/list")
    events = Events()
    async with open_mcp_pool([server(url, "m")], log=events.log, eras=EraCache()) as pool:
        assert len([t for t in pool.tools() if t.name.startswith("filler")]) == 12
        assert {r.uri for r in pool.resources()} >= {"test://static", "test://counter"}
        assert pool.connections["m"].generation == 1
    stats = launch.stats(url)
    ids = stats["request_ids"]
    # initialize refused, then discover broken once and re-issued under a new id.
    assert stats["requests"]["server/discover"] == 2 and len(set(ids["server/discover"])) == 2
    assert stats["requests"]["tools/list"] == 4 + 1  # 17 tools in pages of 5, the first page twice
    assert len(set(ids["tools/list"])) == 5
    assert stats["requests"]["resources/list"] == 2
    assert sorted(e.get("method") for e in reissues(events)) == ["resources/list", "server/discover", "tools/list"]
    assert not events.named("mcp.disconnected")


async def test_broken_read_is_reissued_once_then_surfaced(peer: launch.PeerProcess) -> None:
    url = peer.url
    events = Events()
    async with open_mcp_pool([server(url, "m")], log=events.log, eras=EraCache()) as pool:
        with trio.fail_after(20):
            for how in ("abort", "end"):
                await trio.to_thread.run_sync(lambda h=how: launch.break_next(url, "resources/read", how=h))
                before = launch.stats(url)["requests"].get("resources/read", 0)
                read = await pool.read_resource("test://static", server="m")
                assert read.contents[0]["text"] == "static text"
                assert launch.stats(url)["requests"]["resources/read"] == before + 2
            # A resource whose stream always breaks: one re-issue, then a typed transport error.
            before = launch.stats(url)["requests"]["resources/read"]
            with pytest.raises(ResponseStreamBroken) as info:
                await pool.read_resource("test://broken", server="m")
            assert info.value.reissued is True and info.value.method == "resources/read"
            assert isinstance(info.value, McpTransportError) and info.value.server == "m"
            assert launch.stats(url)["requests"]["resources/read"] == before + 2
            # The connection was never treated as lost.
            assert (await pool.call_tool("m", "echo", {"text": "still here"})).content[0]["text"] == "still here"
        assert pool.connections["m"].generation == 1
    ids = launch.stats(url)["request_ids"]["resources/read"]
    assert len(ids) == len(set(ids)) == 6  # every re-issue under a new id
    assert not events.named("mcp.disconnected") and not events.named("mcp.reconnect")


async def test_broken_tool_call_is_not_resent(peer: launch.PeerProcess) -> None:
    url = peer.url
    events = Events()
    async with open_mcp_pool([server(url, "m")], log=events.log, eras=EraCache()) as pool:
        with trio.fail_after(20):
            with pytest.raises(ResponseStreamBroken) as info:
                await pool.call_tool("m", "break_stream", {})
            assert info.value.reissued is False and info.value.method == "tools/call"
            assert "not re-sent" in str(info.value) and "may or may not have run" in str(info.value)
            # Even a transient break of an ordinary call is not re-sent.
            await trio.to_thread.run_sync(lambda: launch.break_next(url, "tools/call", how="end"))
            with pytest.raises(ResponseStreamBroken):
                await pool.call_tool("m", "echo", {"text": "once"})
            assert (await pool.call_tool("m", "echo", {"text": "after"})).content[0]["text"] == "after"
        assert pool.connections["m"].generation == 1
    stats = launch.stats(url)
    assert stats["broken_calls"] == 1
    assert stats["requests"]["tools/call"] == 3  # break_stream once, echo broken once, echo once
    assert not reissues(events) and not events.named("mcp.disconnected")


async def test_listen_broken_before_its_ack_is_reissued(peer: launch.PeerProcess) -> None:
    url = peer.url
    events = Events()
    async with open_mcp_pool([server(url, "m")], log=events.log, eras=EraCache(),
                             tuning=Tuning(backoff_initial=0.05)) as pool:  # fmt: skip
        updates = pool.updates()
        with trio.fail_after(20):
            listens = launch.stats(url)["requests"]["subscriptions/listen"]
            await trio.to_thread.run_sync(lambda: launch.break_next(url, "subscriptions/listen"))
            assert await pool.subscribe("test://counter")
            assert launch.stats(url)["requests"]["subscriptions/listen"] == listens + 2
            await launch.abump(url, "test://counter")
            update = await updates.receive()
            assert (update.uri, update.synthesized) == ("test://counter", False)
            # Broken twice before the ack: a transport error for that listen (subscribe says "poll for now");
            # the loop retries with backoff and the new listen then carries the URI.
            await trio.to_thread.run_sync(lambda: launch.break_next(url, "subscriptions/listen", count=2))
            assert await pool.subscribe("test://static") is False
            await until(lambda: any("test://static" in (e.get("notifications") or {}).get("resourceSubscriptions", [])
                                    for e in events.named("mcp.stream") if e.get("listen") == "acknowledged"),
                        timeout=20, what="a listen acknowledged with test://static")
            await launch.abump(url, "test://static")
            update = await updates.receive()
            assert (update.uri, update.synthesized) == ("test://static", False)
        assert pool.connections["m"].generation == 1
    assert [e["listen"] for e in events.named("mcp.stream") if e.get("listen") == "reissued"] == ["reissued"] * 2
    assert any("again after re-issuing" in str(e.get("error")) for e in events.named("mcp.subscribe_degraded"))
    assert not events.named("mcp.disconnected")
