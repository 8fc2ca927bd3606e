"""The journal store contract, on both backends (the SQLite file and PostgreSQL; tests/journal/conftest.py):
batches, run status, state, retention, leases."""

from __future__ import annotations

import pytest
import trio

from agentd.journal.records import RunEnded, RunStarted
from agentd.journal.store import Retention
from tests.journal.helpers import WallClock, step


async def test_append_and_read_a_run(open_store):
    clock = WallClock()
    async with open_store(clock) as journal:
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
    async with open_store() as journal:
        assert (await journal.read_run("r1")) == run
        assert await journal.unfinished_runs() == []
        assert await journal.read_run("nope") is None


async def test_concurrent_runs_keep_their_own_sequences(open_store):
    async with open_store() as journal:

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


async def test_state_put_get_delete(open_store):
    async with open_store() as journal:
        await journal.put_state("subscriptions", {"docs file:///a": {"origin": "self"}, "x": [1, 2]})
        await journal.put_state("subscriptions", {"x": None})
        await journal.put_state("other", {"x": 3})
    async with open_store() as journal:
        assert await journal.get_state("subscriptions") == {"docs file:///a": {"origin": "self"}}
        assert await journal.get_state("other") == {"x": 3}
        assert await journal.get_state("empty") == {}


async def test_empty_batch_is_a_programming_error(open_store):
    async with open_store() as journal:
        with pytest.raises(ValueError):
            await journal.append("r", [])


async def test_prune_by_age_and_count_keeps_unfinished(open_store):
    clock = WallClock()
    day = 86400.0
    async with open_store(clock) as journal:
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


async def test_prune_never_removes_the_runs_the_kept_runs_state_names(open_store):
    """A ``--continue`` session's earlier turns are named under ``journal.kept_runs``: retention keeps them, however
    old, and anything but lists of run ids in that state is ignored."""
    from agentd.journal.store import KEPT_RUNS

    clock = WallClock()
    async with open_store(clock) as journal:
        for i in range(5):
            await journal.append(f"r{i}", [RunStarted("d", "x"), RunEnded("completed")])
            clock.now += 86400.0
        await journal.put_state(KEPT_RUNS, {"continue": ["r0", "r2"], "odd": "r1", "odder": [3, None]})
        retention = Retention.of(0, 1, await journal.get_state(KEPT_RUNS))
        assert retention.keep == frozenset({"r0", "r2"})
        assert await journal.prune(retention) == 2  # r1, r3: r4 is the newest, r0 and r2 are kept
        assert {s.run_id for s in await journal.list_runs()} == {"r0", "r2", "r4"}
        assert await journal.prune(Retention(keep_days=None, keep_runs=0)) == 3  # named nowhere now: removed


async def test_leases_claim_renew_release(open_store):
    clock = WallClock()
    async with open_store(clock) as journal:
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




async def test_concurrent_durable_appends_share_commits(open_store):
    """Group commit: the batches of runs that arrive while a commit is in progress go in the next one, each
    run's records in its own order."""
    async with open_store() as journal:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(lambda i=i: journal.append(f"g{i}", step(i), durable=True))
        assert journal.writer.batches == 20 and journal.writer.groups < 20
        for i in range(20):
            run = await journal.read_run(f"g{i}")
            assert run is not None and [e.record for e in run.entries] == step(i)
