"""What a crash of the PostgreSQL server keeps, on a real server: the records agentd acts on commit with
``synchronous_commit = on`` whatever the server's, the database's and the role's default; a group commit
fences each batch on its own lease; a member whose lease was taken over logs ``cluster.fenced`` naming the
new owner; and the postmaster stopped immediately right after a non-idempotent tool call reached its server,
with the member that sent it killed too, never gets that call sent twice by the member that takes over."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from agentd.cluster.errors import LeaseLost
from agentd.cluster.store import open_pg_journal
from agentd.cluster.work import Queue, enqueue
from agentd.journal.recorder import RunRecorder
from agentd.journal.records import ClaimTaken, RunEnded, RunStarted, ToolCallOutcome
from tests.cluster.test_members import _has_request, _is_done, _member_argv, _members, _wait_for
from tests.durable.peer import counting_peer
from tests.journal.helpers import WallClock, step
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call
from tests.postgres import PASSWORD, USER
from tests.waiting import until

#: Crash trials: the step's commit racing the server's crash is what is tested, so it is tried more than once.
TRIALS = 5


def _sql(dsn: str, statement: str) -> list[Any]:
    with psycopg.connect(dsn, password=PASSWORD, autocommit=True) as conn:
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


async def test_records_agentd_acts_on_commit_synchronously_whatever_the_servers_default(pg_dsn):
    """The test server runs with ``synchronous_commit=off`` (its command line); the role's setting in this
    database says ``off`` too. A trigger notes the setting each journal row was written under."""
    async with open_pg_journal(pg_dsn, PASSWORD):
        pass  # the schema
    database = pg_dsn.rsplit("/", 1)[1]
    _sql(pg_dsn, f"ALTER ROLE {USER} IN DATABASE {database} SET synchronous_commit = off")
    _sql(pg_dsn, "CREATE TABLE seen (kind text, sync text)")
    _sql(pg_dsn, "CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "INSERT INTO seen VALUES (NEW.kind, current_setting('synchronous_commit')); RETURN NEW; END $$")
    _sql(pg_dsn, "CREATE TRIGGER note AFTER INSERT ON agentd_entries FOR EACH ROW EXECUTE FUNCTION note()")
    assert _sql(pg_dsn, "SHOW synchronous_commit") == [("off",)]  # what a session gets by default here

    async with open_pg_journal(pg_dsn, PASSWORD) as store:
        lease = await store.claim("r", "m1", ttl=60)
        assert lease is not None
        recorder = RunRecorder(store, "r")
        await recorder.started(RunStarted("d", "charge it"))
        await recorder.replied(1, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "pay__charge", "arguments": "{}"}}]}, 10, 5)
        await recorder.observed(1, "c1", True, "charged")
        await recorder.spawned(2, "0.1", "look it up", None)
        await recorder.child_ended("0.1", "completed", "found")
        await store.append_fenced(lease, step(3), durable=True)
        await recorder.replied(4, {"role": "assistant", "content": "done"}, 10, 5)
        await recorder.ended("completed", {"result": "done"}, None)
    seen = _sql(pg_dsn, "SELECT kind, sync FROM seen")
    assert [k for k, _ in seen] == ["run.started", "model.reply", "tool.requested", "usage", "tool.outcome", "spawn",
                                    "child.result", "model.reply", "tool.requested", "tool.outcome", "usage",
                                    "model.reply", "usage", "run.ended"]
    # synchronous: what agentd acts on outside the journal next (a step with tool calls, the run's end); the rest
    # does not wait for a flush: the next synchronous commit flushes the WAL up to it (docs/durability.md)
    assert [sync for _, sync in seen] == ["off", "on", "on", "on", "off", "off", "off", "on", "on", "on", "on",
                                          "off", "off", "on"], seen


async def test_a_group_commit_fences_each_batch_on_its_own_lease(pg_dsn):
    clock = WallClock()
    async with open_pg_journal(pg_dsn, PASSWORD, clock=clock, lease_clock=clock) as a, \
            open_pg_journal(pg_dsn, PASSWORD, clock=clock, lease_clock=clock) as b:
        kept, lost = await a.claim("kept", "m1", ttl=10), await a.claim("lost", "m1", ttl=10)
        assert kept is not None and lost is not None
        clock.now += 11
        taken = await b.claim("lost", "m2", ttl=10)
        assert taken is not None
        errors: list[LeaseLost] = []

        async def fenced(lease: Any, n: int) -> None:
            try:
                await a.append_fenced(lease, step(n), durable=True)
            except LeaseLost as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fenced, kept, 0)
            nursery.start_soon(fenced, lost, 1)
            nursery.start_soon(fenced, kept, 2)
        assert a.writer.groups < a.writer.batches == 3  # one of them led; the other two shared a commit
        [error] = errors
        assert (error.work, error.token, error.new_owner, error.new_token) == ("lost", lost.token, "m2", taken.token)
        run = await a.read_run("kept")
        assert run is not None and len(run.entries) == 8
        assert await a.read_run("lost") is None  # nothing of the refused batch


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == name:
            out.append(event)
    return out


@pytest.mark.parametrize("refused", ["step", "outcome"])
async def test_a_commit_refused_after_a_takeover_is_cluster_fenced_naming_the_item_and_its_new_owner(
        refused, pg_dsn, tmp_path):
    """Member A's model call (``step``) or its tool call (``outcome``, the commit then comes from inside the
    run's tool-call nursery) is held while another member takes the item over; when it answers, A's commit is
    refused: ``cluster.fenced`` with the item and the new owner, no ``cluster.work_failed``. The lease is long,
    so A's heartbeat cannot find the loss first."""
    release = trio.Event()
    call = tool_call("pay__charge", {"key": "k1", "hold": "gate"} if refused == "outcome" else {"key": "k1"})
    async with counting_peer() as peer, scripted_gateway(
        rules=[Rule({}, {**call, "wait": release} if refused == "step" else call, 1)], default=text("done"),
    ) as gw, open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, peer, ttl=600), 1, tmp_path):
            await enqueue(store, "job-1", "run", {"instruction": "charge it"})
            if refused == "step":
                await _wait_for(lambda: _has_request(gw))
            else:
                await _wait_for(lambda: _received(peer))
            _sql(pg_dsn, "UPDATE agentd_leases SET expires_at = 0 WHERE run_id = 'job-1'")  # as if A were cut off
            # Again until taken: member A's own claim or renewal may hold the item's row at that moment, and a
            # claim skips a locked row (FOR UPDATE SKIP LOCKED: fewer rows than asked, never one twice).
            [item] = await _wait_for(lambda: Queue(store, "member-b", None, 1).claim(1, ttl=600))
            release.set()
            peer.gate.set()
            log = tmp_path / "member0.stderr"

            async def fenced() -> list[dict[str, Any]]:
                return _events(log, "cluster.fenced")

            [event] = await _wait_for(fenced, 60)
        assert event["work"] == "job-1" and event["owner"] == "member-b" and event["new_token"] == item.lease.token
        assert event["level"] == "warn"
        assert _events(log, "cluster.work_failed") == []
        sent = [(call["name"], call["key"]) for call in peer.received]
        assert sent == ([] if refused == "step" else [("charge", "k1")])
        run = await store.read_run("job-1")
        assert run is not None and not any(isinstance(e.record, ToolCallOutcome) for e in run.entries)
        assert isinstance(run.entries[-1].record, ClaimTaken) and run.entries[-1].record.owner == "member-b"


async def _received(peer: Any) -> bool:
    return bool(peer.received)


def _claimed_by(logs: Path, work_id: str) -> int:
    """Which member (its index) claimed ``work_id``, from the members' event logs."""
    for index in range(2):
        if any(e.get("work") == work_id for e in _events(logs / f"member{index}.stderr", "cluster.claimed")):
            return index
    raise AssertionError(f"nobody claimed {work_id}")


def _crash(pg_server: Any) -> None:
    """An immediate shutdown of the postmaster (SIGQUIT: every server process exits at once, nothing flushed)."""
    with open(os.path.join(pg_server.data, "postmaster.pid")) as f:
        os.kill(int(f.readline()), signal.SIGQUIT)


async def test_a_database_crash_after_a_non_idempotent_call_never_gets_it_sent_twice(pg_server, pg_dsn, tmp_path):
    """Per trial: a member's run sends ``charge`` (the server executes it and keeps the call open); the moment
    it has executed, the postmaster is stopped immediately and the member SIGKILLed (its host lost too); once
    the server is back the other member takes the item over and resumes it from the journal. The step that
    asked for the call was committed synchronously before the call was sent, so the call is pending in the
    journal and never sent again: one execution per trial."""
    rules = [Rule({"last_role": "user", "contains": f"order {i}"},
                  tool_call("pay__charge", {"key": f"k{i}", "hold": "after"})) for i in range(TRIALS)]
    async with counting_peer() as peer, scripted_gateway(rules=rules, default=text("settled")) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        for i in range(TRIALS):
            logs = tmp_path / f"trial{i}"
            logs.mkdir()
            async with _members(_member_argv(pg_dsn, gw, peer), 2, logs) as procs:
                await enqueue(store, f"job-{i}", "run", {"instruction": f"charge order {i}"})
                await until(lambda i=i: any(c["key"] == f"k{i}" for c in peer.executed), timeout=60,
                            what="the charge executed (and held)")
                _crash(pg_server)
                try:  # the member that sent it dies too (its host was lost), before the server is back
                    victim = procs[_claimed_by(logs, f"job-{i}")]
                    victim.send_signal(signal.SIGKILL)
                finally:
                    await trio.to_thread.run_sync(pg_server.stop, "immediate")
                    await trio.to_thread.run_sync(pg_server.start)
                await _wait_for(lambda: _is_done(store, f"job-{i}"), 90)
            executed = [c for c in peer.executed if c["key"] == f"k{i}"]
            assert len(executed) == 1, f"trial {i}: charge k{i} executed {len(executed)} times"
            run = await store.read_run(f"job-{i}")
            assert run is not None and isinstance(run.entries[-1].record, RunEnded)
            assert len({e.record.owner for e in run.entries if isinstance(e.record, ClaimTaken)}) == 2
            outcomes = [e.record for e in run.entries if isinstance(e.record, ToolCallOutcome)]
            assert len(outcomes) == 1 and "not sent again" in str(outcomes[0].result), outcomes
