"""The SQLite journal on real files: batches, run status, state, schema refusal, retention, leases."""

from __future__ import annotations

import sqlite3

import pytest
import trio

from agentd.journal.errors import JournalSchemaError
from agentd.journal.records import RunEnded, RunStarted
from agentd.journal.sqlite import DB_NAME, SCHEMA_VERSION, open_journal
from agentd.journal.store import Retention
from tests.journal.helpers import WallClock, step


async def test_append_and_read_a_run(tmp_path):
    clock = WallClock()
    async with open_journal(str(tmp_path), clock=clock) as journal:
        assert await journal.append("r1", [RunStarted("d", "go", None, parent="p-1")]) == 0
        clock.now += 1
        assert await journal.append("r1", step(0)) == 4
        assert [s.run_id for s in await journal.unfinished_runs()] == ["r1"]
        await journal.append("r1", [RunEnded("completed", {"answer": 42})])
        run = await journal.read_run("r1")
    assert run is not None
    assert run.summary.status == "completed" and run.summary.parent == "p-1" and run.summary.records == 6
    assert run.summary.ended_at == clock.now
    assert [e.seq for e in run.entries] == list(range(6))
    assert [e.record for e in run.entries][1:5] == step(0)
    assert run.entries[0].ts == clock.now - 1 and run.entries[1].ts == clock.now
    assert run.entries[-1].record == RunEnded("completed", {"answer": 42})
    # reopening the file sees the same journal
    async with open_journal(str(tmp_path)) as journal:
        assert (await journal.read_run("r1")) == run
        assert await journal.unfinished_runs() == []
        assert await journal.read_run("nope") is None


async def test_concurrent_runs_keep_their_own_sequences(tmp_path):
    async with open_journal(str(tmp_path)) as journal:

        async def one(run_id: str) -> None:
            await journal.append(run_id, [RunStarted("d", run_id)])
            for n in range(10):
                await journal.append(run_id, step(n))

        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(one, f"r{i}")
        for i in range(5):
            run = await journal.read_run(f"r{i}")
            assert run is not None and [e.seq for e in run.entries] == list(range(41))
            assert run.entries[0].record == RunStarted("d", f"r{i}")
        listed = await journal.list_runs(limit=3)
        assert len(listed) == 3 and {s.status for s in listed} == {"running"}
        assert await journal.list_runs(status="completed") == []


async def test_state_put_get_delete(tmp_path):
    async with open_journal(str(tmp_path)) as journal:
        await journal.put_state("subscriptions", {"docs file:///a": {"origin": "self"}, "x": [1, 2]})
        await journal.put_state("subscriptions", {"x": None})
        await journal.put_state("other", {"x": 3})
    async with open_journal(str(tmp_path)) as journal:
        assert await journal.get_state("subscriptions") == {"docs file:///a": {"origin": "self"}}
        assert await journal.get_state("other") == {"x": 3}
        assert await journal.get_state("empty") == {}


async def test_empty_batch_is_a_programming_error(tmp_path):
    async with open_journal(str(tmp_path)) as journal:
        with pytest.raises(ValueError):
            await journal.append("r", [])


async def test_newer_schema_is_refused_untouched(tmp_path):
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r1", [RunStarted("d", "go")])
    db = tmp_path / DB_NAME
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(JournalSchemaError, match=f"schema version {SCHEMA_VERSION + 1} was written by a newer"):
        async with open_journal(str(tmp_path)):
            pass
    assert db.read_bytes() == before


async def test_foreign_database_and_garbage_are_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    conn = sqlite3.connect(foreign / DB_NAME)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(JournalSchemaError, match="not an agentd journal"):
        async with open_journal(str(foreign)):
            pass
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / DB_NAME).write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(JournalSchemaError, match="not an agentd journal"):
        async with open_journal(str(garbage)):
            pass


async def test_prune_by_age_and_count_keeps_unfinished(tmp_path):
    clock = WallClock()
    day = 86400.0
    async with open_journal(str(tmp_path), clock=clock) as journal:
        # r0..r4 finish one day apart; "live" started first and never ends
        await journal.append("live", [RunStarted("d", "live")])
        for i in range(5):
            await journal.append(f"r{i}", [RunStarted("d", "x"), RunEnded("completed")])
            clock.now += day
        # now = end(r4) + 1 day; r0 ended 5 days ago
        assert await journal.prune(Retention(keep_days=3.5, keep_runs=None)) == 2  # r0 (5 d), r1 (4 d)
        assert {s.run_id for s in await journal.list_runs()} == {"live", "r2", "r3", "r4"}
        assert await journal.prune(Retention(keep_days=None, keep_runs=1)) == 2  # r2, r3
        assert {s.run_id for s in await journal.list_runs()} == {"live", "r4"}
        assert await journal.read_run("r2") is None
        assert await journal.prune(Retention(keep_days=0, keep_runs=0), now=clock.now + 10 * day) == 1
        assert [s.run_id for s in await journal.list_runs()] == ["live"]
        assert await journal.prune(Retention(keep_days=None, keep_runs=None)) == 0


async def test_leases_claim_renew_release(tmp_path):
    clock = WallClock()
    async with open_journal(str(tmp_path), clock=clock) as journal:
        a = await journal.claim("r1", "daemon-a", ttl=10)
        assert a is not None and a.expires_at == clock.now + 10
        assert await journal.claim("r1", "daemon-b", ttl=10) is None
        clock.now += 5
        renewed = await journal.renew(a, ttl=10)
        assert renewed is not None and renewed.token == a.token and renewed.expires_at == clock.now + 10
        clock.now += 11
        b = await journal.claim("r1", "daemon-b", ttl=10)
        assert b is not None and b.token > a.token
        assert await journal.renew(renewed, ttl=10) is None  # lost to b
        await journal.release(renewed)  # a stale release does not free b's lease
        assert await journal.claim("r1", "daemon-c", ttl=10) is None
        await journal.release(b)
        assert await journal.claim("r1", "daemon-c", ttl=10) is not None


async def test_a_blocked_disk_never_blocks_the_event_loop(tmp_path):
    """Another connection holds the write lock (as a stalled disk would hold a commit): the append waits on
    the worker thread while trio keeps scheduling; it commits once the lock is released."""
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
        blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        done = trio.Event()
        seq: list[int] = []

        async def append() -> None:
            seq.append(await journal.append("r", step(0)))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append)
            ticks = 0
            for _ in range(50):
                await trio.sleep(0.002)
                ticks += 1
            assert ticks == 50 and not done.is_set()
            blocker.execute("COMMIT")
            blocker.close()
            with trio.fail_after(10):
                await done.wait()
        assert seq == [4]


async def test_a_created_state_dir_is_private(tmp_path):
    state = tmp_path / "new" / "state"
    async with open_journal(str(state)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
    assert (state.stat().st_mode & 0o777) == 0o700
