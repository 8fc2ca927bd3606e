"""What waits for a person as a served event (2026-07-28 wire): a served subagent's call of a tool marked
``--approve`` is ``approval.pending`` (its id, the tool, the run, the argument summary, the subagent's handle) to
a modern-wire poller, and ``approval.decided`` once ``agentd ctl approve`` decided it; both are journaled with
``--state-dir``, so a poller's cursor from before a SIGKILL reads them after the restart. Against a real
``agentd --serve-mcp`` process, the scripted gateway as its model and the counting peer as the marked server.

Each event is its subagent's owner's: the queue's watcher, fed by a real queue, with a principal that owns the
handle and one that does not.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from agentd.oversight.approvals import Approvals, Decision
from agentd.selfmcp.served_events import ServedEvents
from tests.ctl.daemon import ctl
from tests.durable.peer import counting_peer
from tests.integration.agents import agentd_worker
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call
from tests.selfmcp.harness import LegacyPeer
from tests.selfmcp.test_served_events import _modern, _poll

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]


async def _poll_for(client: httpx.AsyncClient, url: str, name: str, cursor: str) -> dict[str, Any]:
    """Poll ``name`` from ``cursor`` until one event came."""
    while True:
        result = await _poll(client, url, cursor, name=name)
        if result["events"]:
            return dict(result["events"][0])
        cursor = result["cursor"]
        await trio.sleep(0.05)  # real time: a poller's pause between two polls of the real daemon


async def test_a_served_subagents_pending_approval_is_an_event_journaled_across_sigkill(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    rules = [Rule({"last_role": "tool"}, text("charged"))]
    async with (
        scripted_gateway(rules=rules, default=tool_call("pay__charge", {"key": "k7", "password": "hunter2hunter2"}))
        as gw,
        counting_peer() as peer,
    ):
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp",
                "--approve", "pay__charge", "--state-dir", str(state), "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(90):
                start = (await _poll(client, url, None, name="approval.pending"))["cursor"]
                peer_ = LegacyPeer(client, url)
                await peer_.initialize()
                answer = await peer_.call("tools/call", {"name": "subagent.spawn",
                                                         "arguments": {"instruction": "charge k7", "async": True}})
                handle = answer["result"]["structuredContent"]["handle"]
                pending = await _poll_for(client, url, "approval.pending", start)
                data = pending["data"]
                assert data["kind"] == "approval" and data["tool"] == "pay__charge" and data["handle"] == handle, data
                assert data["summary"] == {"key": "k7", "password": "***"}, data  # a secret is never shown
                assert isinstance(data["run_id"], str) and data["run_id"] and peer.received == []
                code, listed = await ctl("approvals", "--socket", sock)
                assert code == 0 and [i["id"] for i in listed["approvals"]] == [data["id"]], listed
                code, _ = await ctl("approve", data["id"], "--socket", sock)
                assert code == 0
                decided = await _poll_for(client, url, "approval.decided", start)
                assert decided["data"] == {"id": data["id"], "kind": "approval", "run_id": data["run_id"],
                                           "handle": handle, "action": "approve"}, decided
                finished = await _poll_for(client, url, "subagent.finished", start)
                assert finished["data"]["handle"] == handle and finished["data"]["status"] == "completed"
                assert peer.count("charge") == 1
            os.kill(worker.pid, signal.SIGKILL)

        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(60):  # journaled: the cursor from before the crash reads both again, once
                again = await _poll(client, worker.url, start, name="approval.pending")
                assert [e["eventId"] for e in again["events"]] == [pending["eventId"]], again
                later = await _poll(client, worker.url, start, name="approval.decided")
                assert [e["data"]["action"] for e in later["events"]] == ["approve"], later
                listed_types = (await _modern(client, worker.url, "events/list", {}))["result"]["events"]
                assert {"approval.pending", "approval.decided"} <= {t["name"] for t in listed_types}


async def test_each_event_is_the_owner_of_the_asking_subagents() -> None:
    events = ServedEvents()
    queue = Approvals()
    owners = {"served.1": "alice"}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(events.approvals, queue, lambda path: owners.get(path or ""))
        await trio.testing.wait_all_tasks_blocked()
        start = events.poll({"name": "approval.pending"}, lambda owner: True)["cursor"]
        mine = queue.approval("r-1", "pay", "charge", {"key": "k"}, path="served.1")
        own = queue.approval("r-0", "pay", "charge", {"key": "d"})  # the daemon's own run: the operator's
        queue.decide(mine.id, Decision("deny", "no"))
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert queue.watchers == []  # the watcher leaves with its task

    def seen(name: str, owner: str) -> list[dict[str, Any]]:
        answer = events.poll({"name": name, "cursor": start}, lambda o: o == owner)
        return [e["data"] for e in answer["events"]]

    assert [d["id"] for d in seen("approval.pending", "alice")] == [mine.id]
    assert seen("approval.decided", "alice") == [{"id": mine.id, "kind": "approval", "run_id": "r-1",
                                                  "handle": "served.1", "action": "deny", "reason": "no"}]
    assert [d["id"] for d in seen("approval.pending", "bob")] == []
    assert [d["id"] for d in seen("approval.pending", "")] == [own.id]  # LOCAL_KEY: the operator's
