"""The tasks extension (2026-07-28) against the project's own modern-only peer (tests/peers/servers/
modern_only_server.py ``--tasks``, a real process written from the extension's text): the extension declared per
request, the handle polled with the task id routed in ``Mcp-Name``, ``input_required`` answered once with
``tasks/update``, and an abandoned task cancelled. No timing assumptions: the peer's clock decides when a task is
done, agentd only waits for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.client.check import run_check
from tests.client.helpers import Events, server
from tests.peers import launch
from tests.waiting import until

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def task_peer() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(launch.modern_server_argv(tasks=True)) as peer:
        yield peer


async def test_a_task_is_polled_answered_and_its_result_returned(task_peer: launch.PeerProcess) -> None:
    events = Events()
    async with open_mcp_pool([server(task_peer.url, "m")], log=events.log) as pool:
        assert pool.connections["m"].capabilities["extensions"] == {"io.modelcontextprotocol/tasks": {}}
        calls_before = launch.stats(task_peer.url)["requests"].get("tools/call", 0)
        with trio.fail_after(30):
            got = await pool.call_tool("m", "research", {"topic": "tides", "seconds": 0.5, "ask": True})
    assert got.content == [{"type": "text", "text": 'researched tides (answer: {"action": "decline"})'}]
    assert launch.stats(task_peer.url)["requests"]["tools/call"] == calls_before + 1
    (task_id,) = {e["task_id"] for e in events.named("mcp.task")}
    state = await trio.to_thread.run_sync(launch.tasks_state, task_peer.url)
    assert state["tasks"][task_id]["status"] == "completed"
    assert [u for u in state["updates"] if u["taskId"] == task_id] == [
        {"taskId": task_id, "inputResponses": {"confirm": {"action": "decline"}}}]
    statuses = [e["status"] for e in events.named("mcp.task")]
    assert statuses[0] == "working" and "input_required" in statuses and statuses[-1] == "completed"
    assert [e["keys"] for e in events.named("mcp.task_input")] == [["confirm"]]


async def test_an_abandoned_task_is_cancelled(task_peer: launch.PeerProcess) -> None:
    events = Events()
    async with open_mcp_pool([server(task_peer.url, "m")], log=events.log) as pool:
        with trio.move_on_after(30) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.call_tool, "m", "research", {"topic": "forever", "seconds": 3600})
                await until(lambda: events.named("mcp.task"), timeout=30, what="mcp.task")
                nursery.cancel_scope.cancel()  # the run is cancelled while its task is working
        assert not deadline.cancelled_caught
    (task_id,) = {e["task_id"] for e in events.named("mcp.task")}
    state = await trio.to_thread.run_sync(launch.tasks_state, task_peer.url)
    assert task_id in state["cancelled"] and state["tasks"][task_id]["status"] == "cancelled"
    assert [e["task_id"] for e in events.named("mcp.task_cancelled")] == [task_id]


async def test_check_lists_the_modern_task_tool_as_plain(task_peer: launch.PeerProcess) -> None:
    """On the modern wire the server decides per call: every tool is called plainly, declaring the extension."""
    with trio.fail_after(30):
        doc, code = await run_check([server(task_peer.url, "m")], log=Events().log, secrets=None)
    assert code == 0
    assert {t["name"]: t["calledAs"] for t in doc["servers"][0]["tools"]}["research"] == "plain"


@pytest.fixture(scope="module")
def pushing_peer() -> Iterator[launch.PeerProcess]:
    """Tasks that suggest a 10-minute poll interval (agentd keeps at most 30 s), and push their end."""
    with launch.start_peer(launch.modern_server_argv(tasks=True, push_tasks=True, poll_ms=600_000)) as peer:
        yield peer


async def test_a_pushed_status_wakes_the_poller(pushing_peer: launch.PeerProcess) -> None:
    """agentd asks for the task's ``notifications/tasks`` on its listen stream (``taskIds``, the extension
    declared) and polls ``tasks/get`` as soon as one arrives: the call returns long before the 30 s poll interval
    would have let it (the bound below is that interval: without the push the call cannot end inside it)."""
    events = Events()
    async with open_mcp_pool([server(pushing_peer.url, "m")], log=events.log) as pool:
        with trio.fail_after(20):
            got = await pool.call_tool("m", "research", {"topic": "tides", "seconds": 0.5})
    assert got.content == [{"type": "text", "text": "researched tides"}]
    (task_id,) = {e["task_id"] for e in events.named("mcp.task")}
    state = await trio.to_thread.run_sync(launch.tasks_state, pushing_peer.url)
    assert [task_id] in state["listens"] and state["pushed"] == [task_id]
    assert [e["task_id"] for e in events.named("mcp.task_pushed")] == [task_id]
    assert events.named("mcp.task_pushed")[0]["status"] == "completed"
    assert [e["status"] for e in events.named("mcp.task")] == ["working", "completed"]


async def test_a_poll_the_connection_fails_is_tried_again_and_the_task_still_answers(
        task_peer: launch.PeerProcess) -> None:
    """The first ``tasks/get`` breaks, and so does its re-issue (the request's own retries spent): the task runs on
    at the server, so the wait polls it again and the call returns the task's result, the tool called once."""
    events = Events()
    async with open_mcp_pool([server(task_peer.url, "m")], log=events.log) as pool:
        calls_before = launch.stats(task_peer.url)["requests"].get("tools/call", 0)
        await trio.to_thread.run_sync(lambda: launch.break_next(task_peer.url, "tasks/get", count=2))
        with trio.fail_after(30):
            got = await pool.call_tool("m", "research", {"topic": "storms", "seconds": 0.5})
    assert got.content == [{"type": "text", "text": "researched storms"}]
    assert launch.stats(task_peer.url)["requests"]["tools/call"] == calls_before + 1
    [failed] = events.named("mcp.task_poll_failed")
    assert failed["attempt"] == 1 and failed["task_id"] == events.named("mcp.task")[0]["task_id"]
    assert not events.named("mcp.task_cancelled")
