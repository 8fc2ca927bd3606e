"""A run's subagents are journaled (``spawn``, ``child.result``) and ``agentd journal show`` lists them; an async
child that was running when its parent was SIGKILLed is resumed by the resumed parent under its handle, from its
own journal (its non-idempotent tool call in flight happens once), and answers the parent's await."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import trio

from agentd.journal.sqlite import JournalFile, db_path
from tests.ctl.daemon import ROOT, daemon, env, kill
from tests.durable.peer import counting_peer
from tests.integration.agents import text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

RUN = "delegate-1"


def _records(state: Any) -> list[dict[str, Any]]:
    try:
        journal = JournalFile(db_path(str(state)), readonly=True)
    except Exception:
        return []
    try:
        _, rows = journal.read_raw(RUN)
    finally:
        journal.close()
    return [{"kind": kind, **json.loads(body)} for _, _, kind, body in rows]


async def test_spawns_and_child_results_are_journaled_and_a_running_child_resumes_after_sigkill(tmp_path):
    state = tmp_path / "state"
    hold, held = trio.Event(), []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        first = text_of(request.messages[0].get("content")) if request.messages else ""
        first += " ".join(text_of(m.get("content")) for m in request.messages[:2] if m.get("role") == "user")
        last = request.messages[-1] if request.messages else {}
        if "QUICK" in first:
            return text("quick done")
        if "SLOW-CHILD" in first:
            if last.get("role") == "tool":
                return text("charged")
            return tool_call("pay__charge", {"key": "order-5", "hold": "after"})  # executes, then hangs
        observed = sum(1 for m in request.messages if m.get("role") == "tool")
        if observed == 0:
            return tool_call("subagent_spawn", {"instruction": "QUICK: say done"})
        if observed == 1:
            return tool_call("subagent_spawn", {"instruction": "SLOW-CHILD: charge order 5", "async": True})
        if not held:
            held.append(True)
            return text("never", wait=hold)  # the parent's next reply hangs: killed here
        if observed == 2:  # resumed: the slow child resumed under its handle
            return tool_call("subagent_await", {"handle": "0.2"})
        if observed == 3:  # one more child, numbered after the journaled ones
            return tool_call("subagent_spawn", {"instruction": "QUICK: once more"})
        return text("done with the slow child")

    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "PARENT: delegate",
                "--run-id", RUN, "--state-dir", str(state), "--deadline", "120s"]
        async with daemon(argv, tmp_path, "first") as d:
            await d.until(lambda: peer.count("charge") == 1 and held)
            kinds = [r["kind"] for r in _records(state)]
            assert kinds.count("spawn") == 2 and kinds.count("child.result") == 1, kinds
            kill(d)
            await d.wait()

        async with daemon(argv, tmp_path, "second") as d:
            code, result = await d.wait(timeout=90)
        stderr = d.stderr.read_text()
        assert code == 0 and result["result"] == "done with the slow child", stderr[-3000:]
        assert peer.count("charge") == 1 and len(peer.received) == 1  # its call in flight was not made again
        assert '"lost_children":[],"resumed_children":["0.2"]' in stderr.replace(" ", "")
        del gw

    records = _records(state)
    spawns = [r for r in records if r["kind"] == "spawn"]
    results = {r["handle"]: r for r in records if r["kind"] == "child.result"}
    assert [(s["handle"], s["instruction"]) for s in spawns] == [
        ("0.1", "QUICK: say done"), ("0.2", "SLOW-CHILD: charge order 5"), ("0.3", "QUICK: once more")]
    assert results["0.1"]["status"] == "completed" and results["0.1"]["result"] == "quick done"
    assert results["0.2"]["status"] == "completed" and results["0.3"]["status"] == "completed"

    with trio.fail_after(30):
        shown = await trio.run_process([sys.executable, "-m", "agentd", "journal", "show", RUN, "--state-dir",
                                        str(state)], capture_stdout=True, capture_stderr=True, env=env(), cwd=ROOT)
    lines = json.loads(shown.stdout)["records"]
    assert [(r["kind"], r.get("handle"), r.get("status")) for r in lines if r["kind"] in ("spawn", "child.result")
            ] == [("spawn", "0.1", None), ("child.result", "0.1", "completed"), ("spawn", "0.2", None),
                  ("child.result", "0.2", "completed"), ("spawn", "0.3", None), ("child.result", "0.3", "completed")]


async def test_graph_nodes_are_journaled_like_spawns(tmp_path):
    state = tmp_path / "state"

    def reply(request: RecordedRequest) -> dict[str, Any]:
        first = text_of(request.messages[0].get("content")) if request.messages else ""
        first += " ".join(text_of(m.get("content")) for m in request.messages[:2] if m.get("role") == "user")
        if "NODE" in first:
            return text("node done")
        if not any(m.get("role") == "tool" for m in request.messages):
            return tool_call("graph_run", {"nodes": [{"id": "a", "instruction": "NODE a"},
                                                     {"id": "b", "instruction": "NODE b", "after": ["a"]}]})
        return text("graph done")

    async with scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--instruction", "PARENT: run a graph", "--run-id", RUN,
                "--state-dir", str(state), "--deadline", "120s"]
        async with daemon(argv, tmp_path, "graph") as d:
            code, result = await d.wait(timeout=90)
    assert code == 0 and result["result"] == "graph done", d.stderr.read_text()[-3000:]
    records = _records(state)
    spawns = [r for r in records if r["kind"] == "spawn"]
    ended = [r for r in records if r["kind"] == "child.result"]
    assert sorted(r["instruction"] for r in spawns) == ["NODE a", "NODE b"], records
    assert sorted(r["handle"] for r in ended) == sorted(r["handle"] for r in spawns)
    assert all(r["status"] == "completed" for r in ended)
