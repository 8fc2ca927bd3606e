"""In a cluster the whole tree of a work item is durable: its subagents journal their runs (``ITEM/STEP.CALL``) in
the shared PostgreSQL journal, fenced by the item's lease. Two agentd members against a real PostgreSQL; the owner
of an item whose subagent has a non-idempotent call in flight is SIGKILLed; the other member takes the item over
after the lease, resumes it from the journal, and the subagent resumes from its own journal: the call is reported
to its model as unknown and never sent again (counted at a real MCP server), and its result reaches the item's
run. A synchronous spawn is made again by the resumed run; an async one is spawned again under the handle the
model holds, and the model's ``subagent.await`` of it answers with the finished result.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
import trio

from agentd.cluster.store import open_pg_journal
from agentd.cluster.work import enqueue
from agentd.journal.records import RunEnded, RunStarted, ToolCallRequested
from tests.cluster.test_members import _is_done, _logged, _member_argv, _members, _owners, _pid_of, _wait_for
from tests.durable.peer import counting_peer
from tests.durable.test_tree_crash import UNKNOWN, _said
from tests.integration.agents import text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.postgres import PASSWORD

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]


def _reply(mode: str, hold: str = "after") -> Any:
    """The item's run spawns one child (``mode``: sync, or async and then awaited until done); the child charges
    once (``hold``: the call hangs before or after it takes effect: the owner dies waiting) and reports what it
    saw."""

    def reply(request: RecordedRequest) -> dict[str, Any]:
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in _said(request):
            if last.get("role") == "tool":
                return text(f"child saw: {text_of(last.get('content'))}")
            return tool_call("pay__charge", {"key": "order-1", "hold": hold})
        if not any(m.get("role") == "tool" for m in request.messages):
            return tool_call("subagent_spawn", {"instruction": "CHILD: charge order 1", "async": mode == "async"})
        content = text_of(last.get("content"))
        if mode == "sync" or '"done": true' in content:
            return text(f"parent got: {content}")
        return tool_call("subagent_await", {"handle": "0.1"})

    return reply


@pytest.mark.parametrize(("mode", "hold"), [("sync", "after"), ("sync", "before"), ("async", "after")])
async def test_a_childs_call_in_flight_is_not_sent_again_after_a_failover(pg_dsn, tmp_path, mode, hold):
    async with counting_peer() as peer, scripted_gateway(default=_reply(mode, hold)) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, peer, "--cancel-grace", "1"), 2, tmp_path) as procs:
            await enqueue(store, "job-1", "run", {"instruction": "PARENT: delegate"})
            [first] = await _wait_for(lambda: _owners(store, "job-1"))

            async def charged() -> bool:
                return len(peer.received) == 1

            await _wait_for(charged)  # received (executed or not), its answer held: the owner dies waiting
            next(p for p in procs if p.pid == _pid_of(first)).send_signal(signal.SIGKILL)
            await _wait_for(lambda: _is_done(store, "job-1"), 90)
        owners = await _owners(store, "job-1")
        item = await store.read_run("job-1")
        child = await store.read_run("job-1/1.call_1")
    assert len(owners) == 2 and owners[1] != first, owners
    assert [c["name"] for c in peer.received] == ["charge"], peer.received  # never sent again
    assert peer.count("charge") == (1 if hold == "after" else 0)
    assert item is not None and child is not None
    ended = item.entries[-1].record
    assert isinstance(ended, RunEnded) and ended.status == "completed", ended
    answer = str(ended.result["result"] if isinstance(ended.result, dict) else ended.result)
    assert answer.startswith("parent got:") and "child saw:" in answer and UNKNOWN in answer, answer
    if mode == "async":
        seen = json.loads(answer.removeprefix("parent got: ").split("\n", 1)[0])
        assert seen["handle"] == "0.1" and seen["status"] == "completed" and seen["done"] is True, seen
    records = [e.record for e in child.entries]
    assert isinstance(records[0], RunStarted) and records[0].parent == "0", records[0]
    assert [r.name for r in records if isinstance(r, ToolCallRequested)] == ["pay__charge"]
    assert isinstance(records[-1], RunEnded) and records[-1].status == "completed", records[-1]


async def test_a_members_own_runs_child_resumes_from_the_shared_journal_after_a_restart(pg_dsn, tmp_path):
    """A member's own run (``--instruction``, ``--run-id``) is not a work item, but its subagents journal in the
    shared database as well: the member SIGKILLed while its child's call is in flight and started again with the
    same run id resumes the run, and the child resumes from its journal (the call not sent again)."""
    async with counting_peer() as peer, scripted_gateway(default=_reply("sync")) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        argv = _member_argv(pg_dsn, gw, peer, "--cancel-grace", "1", "--instruction", "PARENT: delegate",
                            "--run-id", "own-1")
        (tmp_path / "first").mkdir()
        async with _members(argv, 1, tmp_path / "first") as [proc]:

            async def charged() -> bool:
                return peer.count("charge") == 1

            await _wait_for(charged)
            proc.send_signal(signal.SIGKILL)
            with trio.fail_after(30):
                await proc.wait()
        (tmp_path / "second").mkdir()
        async with _members(argv, 1, tmp_path / "second") as [again]:
            with trio.fail_after(90):
                await again.wait()
        assert again.returncode == 0, (tmp_path / "second" / "member0.stderr").read_text()[-3000:]
        item = await store.read_run("own-1")
        child = await store.read_run("own-1/1.call_1")
    assert [c["name"] for c in peer.received] == ["charge"], peer.received
    assert item is not None and child is not None
    ended = item.entries[-1].record
    assert isinstance(ended, RunEnded) and ended.status == "completed", ended
    answer = str(ended.result["result"] if isinstance(ended.result, dict) else ended.result)
    assert answer.startswith("parent got:") and UNKNOWN in answer, answer
    assert isinstance(child.entries[-1].record, RunEnded), child.entries[-1]


async def test_a_paused_owners_child_commits_nothing_and_sends_nothing(pg_dsn, tmp_path):
    """Member A is SIGSTOPped while its item's child waits for its model (the child process itself keeps
    running); past A's lease B takes the item over and finishes it, its own child resuming the child's run. Then
    A's child gets its model's answer, a non-idempotent tool call: its step's commit is fenced by the item's lease
    (B's now), so it commits nothing and the call is never sent."""
    release, asked = trio.Event(), []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in _said(request):
            asked.append(True)
            if len(asked) == 1:  # A's child: answers once A has lost the item
                return {**tool_call("pay__charge", {"key": "k1"}), "wait": release}
            return text("child done by the new owner")
        if last.get("role") == "tool":
            return text(f"parent got: {text_of(last.get('content'))}")
        return tool_call("subagent_spawn", {"instruction": "CHILD: charge it"})

    # A stays stopped for as long as B's takeover and A's child's refused commit take: on a loaded machine longer
    # than the default pong timeout (10 s), and A, resumed, would judge its child stuck (no pong while A itself
    # was stopped) before it reads the child's report of the fenced commit. A pong timeout longer than any
    # wait here keeps the verdict the child's own.
    pong = ("--pong-timeout", "300s")
    async with counting_peer() as peer, scripted_gateway(default=reply) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, peer, *pong), 2, tmp_path) as procs:
            await enqueue(store, "job-1", "run", {"instruction": "PARENT: delegate"})
            [first] = await _wait_for(lambda: _owners(store, "job-1"))

            async def child_asked() -> bool:
                return bool(asked)

            await _wait_for(child_asked)
            stale = next(p for p in procs if p.pid == _pid_of(first))
            stale.send_signal(signal.SIGSTOP)
            log = tmp_path / f"member{procs.index(stale)}.stderr"
            [child] = [e["child_pid"] for e in map(json.loads, log.read_text().splitlines())
                       if e.get("event") == "subagent.spawn"]
            await _wait_for(lambda: _is_done(store, "job-1"), 60)
            before = await store.read_run("job-1/1.call_1")
            release.set()  # A's child's model answers (A still stopped): charge the card

            async def child_ended() -> bool:  # its fenced commit refused, its turn failed: it exits (a zombie of A)
                return _state(child) in ("Z", None)

            await _wait_for(child_ended, 30)
            after = await store.read_run("job-1/1.call_1")
            stale.send_signal(signal.SIGCONT)
            await _wait_for(lambda: _logged(log, ('"cluster.fenced"', '"cluster.lease_lost"')), 30)
        item = await store.read_run("job-1")
    assert peer.received == [], peer.received
    assert before is not None and after is not None and after.entries == before.entries
    assert isinstance(after.entries[-1].record, RunEnded) and after.entries[-1].record.status == "completed"
    assert item is not None and isinstance(item.entries[-1].record, RunEnded)
    assert "child done by the new owner" in str(item.entries[-1].record.result), item.entries[-1].record
    failed = [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == "subagent.failed"]
    assert [("LeaseLost" in e["reason"]) for e in failed] == [True], failed  # A's child: its commit was fenced


def _state(pid: int) -> str | None:
    """A process's state letter (``Z``: exited, not yet reaped), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return None
