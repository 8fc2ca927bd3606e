"""Interop with the 1.x-era SDK server, npm server-everything, and a real-process kill/restart reconnect."""

from __future__ import annotations

import pytest
import trio

from agentd.client import Tuning, open_mcp_pool
from agentd.errors import McpRpcError, ResourceNotFound
from tests.client.helpers import Events, server
from tests.peers import launch
from tests.waiting import until

pytestmark = pytest.mark.interop


async def test_legacy_1x_sdk_server(legacy_sdk_server: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(legacy_sdk_server.url, "old")], log=Events().log) as pool:
        conn = pool.connections["old"]
        assert conn.era is not None and conn.era.value == "legacy"
        assert conn.protocol_version in ("2025-11-25", "2025-06-18")
        names = [t.name for t in pool.tools()]
        assert {"echo", "add", "fail", "slow", "bump"} <= set(names)
        assert len([n for n in names if n.startswith("filler_")]) == 15  # drained across pages of 10
        with trio.fail_after(20):
            ok = await pool.call_tool("old", "add", {"a": 20, "b": 22})
            assert ok.is_error is False and ok.structured is not None and 42 in ok.structured.values()
            failed = await pool.call_tool("old", "fail", {"message": "bad"})
            assert failed.is_error
            assert (await pool.call_tool("old", "echo", {"text": "hi"})).content[0]["text"] == "hi"
            # Resources, not-found, and a subscription delivered over the 1.x GET stream.
            with pytest.raises(ResourceNotFound) as info:
                await pool.read_resource("test://missing", server="old")
            assert info.value.uri == "test://missing"
            assert await pool.subscribe("test://counter", server="old")
            await pool.call_tool("old", "bump", {"uri": "test://counter"})
            update = await pool.updates().receive()
            assert (update.server, update.uri) == ("old", "test://counter")


async def test_everything_server(everything_server: launch.PeerProcess) -> None:
    async with open_mcp_pool([server(everything_server.url, "ev")], log=Events().log) as pool:
        conn = pool.connections["ev"]
        assert conn.protocol_version is not None and conn.era is not None and conn.era.value == "legacy"
        assert "echo" in [t.name for t in pool.tools()]
        with trio.fail_after(20):
            echo = await pool.call_tool("ev", "echo", {"message": "hello"})
            assert "hello" in echo.content[0]["text"]
            # The TypeScript SDK reports an unknown tool as an isError result (newer) or -32602 (older).
            try:
                unknown = await pool.call_tool("ev", "definitely_not_a_tool", {})
            except McpRpcError as exc:
                assert exc.code in (-32601, -32602)
            else:
                assert unknown.is_error and "definitely_not_a_tool" in unknown.content[0]["text"]
            if pool.resources():
                first = pool.resources()[0]
                read = await pool.read_resource(first.uri, server="ev")
                assert read.contents


async def test_kill_and_restart_resubscribes_and_synthesizes_one_update() -> None:
    port = launch.free_port()
    argv = launch.sdk_server_argv(port=port)
    events = Events()
    tuning = Tuning(backoff_initial=0.2, backoff_max=1.0)
    async with launch.peer_server(argv) as first:
        url = first.url
        async with open_mcp_pool([server(url, "sdk")], log=events.log, tuning=tuning) as pool:
            with trio.fail_after(20):
                assert await pool.subscribe("test://counter")
            # Kill the peer mid-subscription (its own context exit would wait for the pool to end).
            first.proc.kill()
            await until(lambda: not pool.connections["sdk"].connected, timeout=20, what="the connection lost")
            async with launch.peer_server(argv) as second:
                assert second.url == url
                with trio.fail_after(30):
                    update = await pool.updates().receive()
                assert (update.uri, update.synthesized) == ("test://counter", True)
                assert pool.connections["sdk"].connected
                # The re-issued subscription is live on the new server process.
                await launch.abump(url, "test://counter")
                with trio.fail_after(20):
                    update = await pool.updates().receive()
                assert (update.uri, update.synthesized) == ("test://counter", False)
    assert len([e for e in events.named("mcp.updated") if e["synthesized"]]) == 1
    assert any(e.get("resubscribe") for e in events.named("mcp.subscribe"))


async def test_everything_server_task_tool_end_to_end(everything_server: launch.PeerProcess) -> None:
    """``simulate-research-query`` declares ``taskSupport: required``: agentd calls it as a 2025-11-25 task,
    polls ``tasks/get`` at the server's interval (woken early by the ``notifications/tasks/status`` the server
    pushes on the GET stream as the task moves on), fetches ``tasks/result``, and ``agentd check`` lists it as
    called as a task."""
    from agentd.client.check import run_check

    events = Events()
    async with open_mcp_pool([server(everything_server.url, "ev")], log=events.log) as pool:
        assert pool.connections["ev"].catalogue.tool("simulate-research-query") is not None
        with trio.fail_after(30):
            report = await pool.call_tool("ev", "simulate-research-query", {"topic": "tides"})
    assert not report.is_error and "Research Report: tides" in report.content[0]["text"]
    task_events = events.named("mcp.task")
    assert task_events[0]["status"] == "working" and task_events[-1]["status"] == "completed"
    assert any("Analyzing content" in (e["message"] or "") for e in task_events)
    pushed = events.named("mcp.task_pushed")
    assert pushed and {e["task_id"] for e in pushed} == {task_events[0]["task_id"]}, pushed
    with trio.fail_after(30):
        doc, code = await run_check([server(everything_server.url, "ev")], log=Events().log, secrets=None)
    assert code == 0
    tools = {t["name"]: t for t in doc["servers"][0]["tools"]}
    assert tools["simulate-research-query"]["calledAs"] == "task" and tools["echo"]["calledAs"] == "plain"
    assert doc["servers"][0]["unusableTools"] == []
