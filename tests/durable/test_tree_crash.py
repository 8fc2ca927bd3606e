"""The whole tree is durable: a subagent journals its own steps in the tree's journal, and after a SIGKILL of the
root, of the child, or of both at once, the same tool call is never made twice (counted at a real MCP server).

A synchronous ``subagent.spawn`` in flight at the crash is made again by the resumed parent: its child runs under
the same journaled run id (``PARENT/STEP.CALL``), so it resumes from its last committed step (a non-idempotent
call it had in flight is reported to its model as unknown) and its result reaches the resumed parent. Each
scenario runs several times (``AGENTD_CRASH_REPEAT``, default 3) with fresh run ids, to catch a race between the
kill and the commits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.journal.sqlite import JournalFile, db_path
from tests.ctl.daemon import Daemon, daemon, kill
from tests.durable.peer import CountingPeer, counting_peer
from tests.integration.agents import text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

REPEAT = int(os.environ.get("AGENTD_CRASH_REPEAT", "3"))
UNKNOWN = "may or may not have run"


def _runs(state: Path) -> dict[str, list[dict[str, Any]]]:
    """Every journaled run's records, by run id."""
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        runs = {s.run_id: journal.read_raw(s.run_id)[1] for s in journal.list_runs(1000, None)}
    finally:
        journal.close()
    return {run: [{"kind": kind, **json.loads(body)} for _, _, kind, body in rows] for run, rows in runs.items()}


def _said(request: RecordedRequest) -> str:
    return " ".join(text_of(m.get("content")) for m in request.messages[:2] if m.get("role") in ("system", "user"))


def _reply(hold: str, gate: trio.Event) -> Any:
    """The parent spawns one synchronous child; the child charges once (``hold``: the first charge hangs before
    or after it takes effect; ``reply``: the charge answers, the child's next model reply waits for ``gate``) and
    reports what it saw; the parent answers with the child's report."""

    def reply(request: RecordedRequest) -> dict[str, Any]:
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in _said(request):
            if last.get("role") == "tool":
                seen = text_of(last.get("content"))
                return text(f"child saw: {seen}", **({"wait": gate} if hold == "reply" else {}))
            return tool_call("pay__charge", {"key": "order-1", **({"hold": hold} if hold != "reply" else {})})
        if last.get("role") == "tool":
            return text(f"parent got: {text_of(last.get('content'))}")
        return tool_call("subagent_spawn", {"instruction": "CHILD: charge order 1"})

    return reply


def _child_pid(d: Daemon) -> int | None:
    pids = [e.get("child_pid") for e in d.events("subagent.spawn")]
    return pids[-1] if pids and isinstance(pids[-1], int) else None


async def _crash_and_resume(tmp: Path, peer: CountingPeer, gw_url: str, run: str, *, hold: str, target: str,
                            gate: trio.Event) -> tuple[int, dict[str, Any], Daemon]:
    state = tmp / "state"
    argv = ["--intelligence", gw_url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "PARENT: delegate",
            "--run-id", run, "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "1"]
    async with daemon(argv, tmp, f"{run}-first") as d:
        if hold == "reply":  # the charge answered; the child's reply after it is held
            await d.until(lambda: peer.count("charge") == 1 and len(_runs(state).get(f"{run}/1.call_1", [])) >= 5)
        else:
            await d.until(lambda: len(peer.received) == 1)
        child = _child_pid(d)
        assert child is not None, d.stderr.read_text()[-3000:]
        if target in ("root", "tree"):
            kill(d)
        if target in ("child", "tree"):
            with contextlib.suppress(ProcessLookupError):  # "tree": it may already be gone with its parent
                os.kill(child, signal.SIGKILL)
        if target == "child":  # the parent goes on: its spawn answers that the child failed
            gate.set()
            code, result = await d.wait(timeout=90)
            return code, result, d
        await d.wait()
    gate.set()
    async with daemon(argv, tmp, f"{run}-second") as again:
        code, result = await again.wait(timeout=90)
    return code, result, again


@pytest.mark.parametrize("hold", ["before", "after", "reply"])
@pytest.mark.parametrize("target", ["root", "tree"])
async def test_a_sync_child_resumes_from_its_journal_after_the_tree_is_killed(tmp_path, hold, target):
    for attempt in range(REPEAT):
        tmp = tmp_path / str(attempt)
        tmp.mkdir()
        gate = trio.Event()
        async with counting_peer() as peer, scripted_gateway(default=_reply(hold, gate)) as gw:
            run = f"tree-{attempt}"
            code, result, d = await _crash_and_resume(tmp, peer, gw.url, run, hold=hold, target=target, gate=gate)
            stderr = d.stderr.read_text()
            assert code == 0, stderr[-3000:]
            assert len(peer.received) == 1 and peer.count("charge") == (0 if hold == "before" else 1), peer.received
            answer = str(result["result"])
            assert answer.startswith("parent got:") and "child saw:" in answer, answer
            if hold == "reply":  # committed before the crash: replayed to the resumed child, not asked again
                assert "execution #1" in answer and UNKNOWN not in answer, answer
            else:
                assert UNKNOWN in answer, answer
            del gw
        runs = _runs(tmp / "state")
        child = runs[f"{run}/1.call_1"]
        assert child[0]["kind"] == "run.started" and child[0]["parent"] == "0", child[0]
        assert child[-1]["kind"] == "run.ended" and child[-1]["status"] == "completed", child[-1]
        assert [r["name"] for r in child if r["kind"] == "tool.requested"] == ["pay__charge"]
        spawns = [r for r in runs[run] if r["kind"] == "spawn"]
        assert [s["run"] for s in spawns] == [f"{run}/1.call_1"], spawns


@pytest.mark.parametrize("hold", ["before", "after"])
async def test_a_killed_child_fails_its_spawn_and_its_call_is_not_made_again(tmp_path, hold):
    for attempt in range(REPEAT):
        tmp = tmp_path / str(attempt)
        tmp.mkdir()
        gate = trio.Event()
        async with counting_peer() as peer, scripted_gateway(default=_reply(hold, gate)) as gw:
            code, result, d = await _crash_and_resume(tmp, peer, gw.url, f"kid-{attempt}", hold=hold,
                                                      target="child", gate=gate)
            assert code == 0, d.stderr.read_text()[-3000:]
            assert "parent got:" in str(result["result"]) and "child saw" not in str(result["result"])
            assert len(peer.received) == 1, peer.received
            del gw


async def test_a_warm_child_of_a_resumed_run_answers_interrupted_with_the_reason(tmp_path):
    state, hold, held = tmp_path / "state", trio.Event(), []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        last = request.messages[-1] if request.messages else {}
        if "WARM-KID" in _said(request):
            return text("kid noted")
        observed = sum(1 for m in request.messages if m.get("role") == "tool")
        if observed == 0:
            return tool_call("subagent_spawn", {"instruction": "WARM-KID: note 7", "warm": True})
        if observed == 1 and not held:
            held.append(True)
            return text("never", wait=hold)  # the parent's next reply hangs: killed here
        if observed == 1:  # resumed: the model talks to its session again
            return tool_call("subagent_send", {"handle": "0.1", "message": "which number?"})
        return text(f"parent saw: {text_of(last.get('content'))}")

    async with scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--instruction", "PARENT: keep a session", "--run-id", "warm-1",
                "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "1"]
        async with daemon(argv, tmp_path, "first") as d:
            await d.until(lambda: bool(held))
            kill(d)
            await d.wait()
        async with daemon(argv, tmp_path, "second") as d:
            code, result = await d.wait(timeout=90)
    assert code == 0, d.stderr.read_text()[-3000:]
    seen = json.loads(str(result["result"]).removeprefix("parent saw: "))
    assert seen["handle"] == "0.1" and seen["status"] == "interrupted" and seen["done"] is True, seen
    assert "cannot be resumed" in seen["result"], seen
    ends = [r for r in _runs(state)["warm-1"] if r["kind"] == "child.result"]
    assert [(r["handle"], r["status"]) for r in ends] == [("0.1", "interrupted")], ends


async def test_a_child_cancelled_by_its_parent_ends_its_journaled_run(tmp_path):
    """A ``subagent.cancel`` is the child run's end (``run.ended`` ``cancelled``), not an interruption to resume
    later: nothing is left unfinished in the journal for it."""
    state, never, asked = tmp_path / "state", trio.Event(), trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        if "CHILD" in _said(request):
            asked.set()
            return text("never", wait=never)  # runs until cancelled
        observed = sum(1 for m in request.messages if m.get("role") == "tool")
        if observed == 0:
            return tool_call("subagent_spawn", {"instruction": "CHILD: wait", "async": True})
        if observed == 1:  # once the child is running its turn
            return tool_call("subagent_cancel", {"handle": "0.1", "reason": "not needed"}, wait=asked)
        return text("cancelled it")

    async with scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--instruction", "PARENT: start and stop", "--run-id", "cancel-1",
                "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "5"]
        async with daemon(argv, tmp_path, "cancel") as d:
            code, result = await d.wait(timeout=90)
    assert code == 0 and result["result"] == "cancelled it", d.stderr.read_text()[-3000:]
    child = _runs(state)["cancel-1/1.call_1"]
    assert child[-1]["kind"] == "run.ended" and child[-1]["status"] == "cancelled", child[-1]
    assert child[-1]["error"] == "not needed", child[-1]


async def test_a_graph_in_flight_resumes_its_unfinished_nodes_and_replays_its_finished_ones(tmp_path):
    state = tmp_path / "state"

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said, last = _said(request), (request.messages[-1] if request.messages else {})
        if "NODE-A" in said:
            return text("a done")
        if "NODE-B" in said:
            if last.get("role") == "tool":
                return text(f"b saw: {text_of(last.get('content'))}")
            return tool_call("pay__charge", {"key": "order-b", "hold": "after"})  # executes, then hangs
        if last.get("role") == "tool":
            return text(f"graph: {text_of(last.get('content'))}")
        return tool_call("graph_run", {"nodes": [{"id": "a", "instruction": "NODE-A: quick"},
                                                 {"id": "b", "instruction": "NODE-B: charge"}]})

    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "PARENT: graph",
                "--run-id", "graph-1", "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "1"]
        async with daemon(argv, tmp_path, "first") as d:
            await d.until(lambda: peer.count("charge") == 1
                          and (_runs(state).get("graph-1/1.call_1/a") or [{}])[-1].get("kind") == "run.ended")
            kill(d)
            await d.wait()
        before = sum(1 for r in gw.requests if "NODE-A" in _said(r))
        async with daemon(argv, tmp_path, "second") as d:
            code, result = await d.wait(timeout=90)
        assert code == 0, d.stderr.read_text()[-3000:]
        again = sum(1 for r in gw.requests if "NODE-A" in _said(r))
        assert again == before  # node a's run had ended: replayed, its model not asked again
        del gw
    nodes = json.loads(str(result["result"]).removeprefix("graph: "))["nodes"]
    assert nodes["a"]["status"] == "completed" and nodes["a"]["result"] == "a done", nodes
    assert nodes["b"]["status"] == "completed" and UNKNOWN in nodes["b"]["result"], nodes
    assert len(peer.received) == 1  # b's charge in flight was not made again
