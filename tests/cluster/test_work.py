"""Members and work claims on a real PostgreSQL: capacity, SKIP LOCKED, once per key, lease expiry and re-claim,
fenced finish, the claim journaled in the claim's transaction, the capacity signal, and the member loop."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from agentd.cluster.capacity import read_capacity
from agentd.cluster.errors import LeaseLost
from agentd.cluster.member import Member
from agentd.cluster.store import FencedJournal, PgJournal, open_database, open_pg_journal
from agentd.cluster.work import Queue, WorkItem, enqueue, view
from agentd.config.load import load_config
from agentd.journal.records import ClaimTaken, RunEnded, RunStarted
from agentd.telemetry.events import EventLog
from tests.journal.helpers import WallClock, step
from tests.postgres import PASSWORD
from tests.waiting import until


async def _stores(stack: AsyncExitStack, dsn: str, n: int, clock: WallClock | None = None) -> list[PgJournal]:
    extra = {"clock": clock, "lease_clock": clock} if clock is not None else {}
    return [await stack.enter_async_context(open_pg_journal(dsn, PASSWORD, **extra)) for _ in range(n)]


async def test_claims_spread_within_capacity_and_never_twice(pg_dsn):
    async with AsyncExitStack() as stack:
        stores = await _stores(stack, pg_dsn, 3)
        for i in range(30):
            assert await enqueue(stores[0], f"w{i:02}", "spawn", {"instruction": f"job {i}"})
        queues = [Queue(s, f"m{i}", None, capacity=4) for i, s in enumerate(stores)]
        got: dict[str, list[WorkItem]] = {}

        async def claim(q: Queue) -> None:
            # A claim may take fewer than it asks when another member commits the same rows first (they are
            # passed over, never taken twice); a member claims again, as its loop does at its next wake.
            items: list[WorkItem] = []
            for _ in range(10):
                items += await q.claim(q.capacity - len(items), ttl=30)
                if len(items) == q.capacity:
                    break
            got[q.member] = items

        async with trio.open_nursery() as nursery:
            for q in queues:
                nursery.start_soon(claim, q)
        ids = [item.work_id for items in got.values() for item in items]
        assert all(len(items) == 4 for items in got.values())
        assert len(ids) == len(set(ids)) == 12
        tokens = [item.lease.token for items in got.values() for item in items]
        assert len(set(tokens)) == 12
        # the claim is in the run's journal, committed with it
        first = got["m0"][0]
        run = await stores[0].read_run(first.work_id)
        assert run is not None and run.entries[0].record == ClaimTaken("m0", first.lease.token, 1)
        signal = await read_capacity(stores[0], ttl=30)
        assert signal.queued == 18 and signal.running == 0  # members not registered: running counts members



async def test_one_key_is_one_item(pg_dsn):
    async with AsyncExitStack() as stack:
        stores = await _stores(stack, pg_dsn, 2)
        results: list[bool] = []

        async def fire(store: PgJournal) -> None:
            results.append(await enqueue(store, "schedule:nightly:1800000000", "schedule", {"instruction": "x"}))

        async with trio.open_nursery() as nursery:
            for store in stores * 3:
                nursery.start_soon(fire, store)
        assert sorted(results) == [False] * 5 + [True]


async def test_an_expired_lease_is_reclaimed_and_the_old_owner_finishes_nothing(pg_dsn):
    clock = WallClock()
    async with AsyncExitStack() as stack:
        a_store, b_store = await _stores(stack, pg_dsn, 2, clock)
        a, b = Queue(a_store, "a", None, 2), Queue(b_store, "b", None, 2)
        await enqueue(a_store, "w1", "spawn", {"instruction": "go"})
        [item] = await a.claim(2, ttl=10)
        as_a = FencedJournal(a_store, item.lease)
        await as_a.append("w1", [RunStarted("d", "go")])
        await as_a.append("w1", step(0))
        assert await b.claim(2, ttl=10) == []  # a's lease is live
        clock.now += 5
        assert await a.heartbeat([item.lease], ttl=10) == set()  # renewed to now + 10
        clock.now += 6
        assert await b.claim(2, ttl=10) == []
        clock.now += 5  # a missed its heartbeat: expired
        [again] = await b.claim(2, ttl=10)
        assert again.work_id == "w1" and again.attempt == 2 and again.lease.token > item.lease.token
        assert await a.heartbeat([item.lease], ttl=10) == {"w1"}  # a learns it lost the run
        with pytest.raises(LeaseLost):
            await as_a.append("w1", step(1))
        with pytest.raises(LeaseLost):
            await a.finish(item.lease)
        run = await b_store.read_run("w1")
        assert run is not None
        kinds = [e.record.KIND for e in run.entries]
        assert kinds == ["claim.taken", "run.started", "model.reply", "tool.requested", "tool.outcome", "usage",
                         "claim.taken"]
        await FencedJournal(b_store, again.lease).append("w1", [RunEnded("completed", "ok")])
        await b.finish(again.lease)
        seen = await view(a_store, "w1")
        assert seen is not None and seen.status == "done" and seen.attempts == 2
        clock.now += 100
        assert await a.claim(2, ttl=10) == []  # done is done


async def test_not_before_delays_a_claim(pg_dsn):
    clock = WallClock()
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1, clock)
        q = Queue(store, "a", None, 1)
        await enqueue(store, "later", "schedule", {}, not_before=clock.now + 60)
        assert await q.claim(1, ttl=10) == []
        clock.now += 61
        assert [i.work_id for i in await q.claim(1, ttl=10)] == ["later"]


async def _done(store: PgJournal, n: int) -> int:
    views = [await view(store, f"w{i}") for i in range(n)]
    return sum(1 for v in views if v is not None and v.status == "done")


async def _all_done(store: PgJournal, n: int) -> bool:
    return await _done(store, n) >= n


async def test_members_run_work_once_each_spread_over_both(pg_dsn):
    """Two member loops (each listening for NOTIFY): all work runs exactly once, on both, and finishes."""
    ran: dict[str, list[str]] = {}
    log = EventLog(sink=lambda line: None)
    async with AsyncExitStack() as stack:
        stores = await _stores(stack, pg_dsn, 3)
        listeners = [await open_database(pg_dsn, PASSWORD, "l") for _ in range(2)]
        for db in listeners:
            stack.push_async_callback(db.aclose)

        def execute_as(member: str):
            async def execute(item: WorkItem, journal: FencedJournal) -> None:
                ran.setdefault(item.work_id, []).append(member)
                await journal.append(item.work_id, [RunStarted("d", item.payload["instruction"])])
                await trio.sleep(0.05)  # real time: a run's length, so one member cannot take every item alone
                await journal.append(item.work_id, [RunEnded("completed", member)])
            return execute

        members = [Member(Queue(stores[i], f"m{i}", None, capacity=2), execute_as(f"m{i}"), log, ttl=5,
                          listen_db=listeners[i]) for i in range(2)]
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for m in members:
                    await nursery.start(m.serve)
                await trio.sleep(0.3)  # real time: both idle, listening on their real database connections
                for i in range(8):
                    await enqueue(stores[2], f"w{i}", "spawn", {"instruction": f"job {i}"})
                await until(lambda: _all_done(stores[2], 8), timeout=60, what="8 items done")
                nursery.cancel_scope.cancel()
        assert sorted(ran) == [f"w{i}" for i in range(8)]
        assert all(len(who) == 1 for who in ran.values())
        assert {who[0] for who in ran.values()} == {"m0", "m1"}


async def test_an_item_that_cannot_run_ends_failed_and_the_member_goes_on(pg_dsn):
    log = EventLog(sink=lambda line: None)
    ran: list[str] = []
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1)

        async def execute(item: WorkItem, journal: FencedJournal) -> None:
            ran.append(item.work_id)
            if "instruction" not in item.payload:
                raise KeyError("instruction")
            await journal.append(item.work_id, [RunEnded("completed", "ok")])

        member = Member(Queue(store, "m0", None, capacity=1), execute, log, ttl=5)
        await enqueue(store, "w0", "spawn", {})
        await enqueue(store, "w1", "spawn", {"instruction": "fine"})
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(member.serve)
                await until(lambda: _all_done(store, 2), timeout=30, what="2 items done")
                nursery.cancel_scope.cancel()
        bad = await store.read_run("w0")
        assert bad is not None and bad.summary.status == "failed"
        assert "KeyError" in (bad.entries[-1].record.error or "")
        assert ran == ["w0", "w1"]


async def test_a_cron_occurrence_fires_once_across_members(pg_dsn, autojump_clock):
    """Two members run the same --cron schedule: each occurrence is enqueued by both, exists once."""
    import types

    from agentd.config.cron import CronSchedule
    from agentd.modes.drivers import DaemonContext, _cron

    epoch = 1_800_000_000.0
    created: list[bool] = []
    attempted: list[str] = []
    async with AsyncExitStack() as stack:
        stores = await _stores(stack, pg_dsn, 2)

        async def member(store: PgJournal) -> None:
            runs = types.SimpleNamespace(accepting=True)
            fired = 0

            async def fire_once(key: str, instruction: str) -> bool:
                nonlocal fired
                fired += 1
                if fired == 3:
                    runs.accepting = False
                made = await enqueue(store, key, "schedule", {"instruction": instruction})
                created.append(made)
                attempted.append(key)
                return made

            ctx = DaemonContext(_cfg(), runs, EventLog(sink=lambda line: None), trio.Event(),  # type: ignore[arg-type]
                                wall_clock=lambda: epoch + trio.current_time(), fire_once=fire_once)
            await _cron(ctx, CronSchedule.parse("*/5 * * * *"))

        async with trio.open_nursery() as nursery:
            for store in stores:
                nursery.start_soon(member, store)
        rows = await stores[0].db.call(lambda conn: conn.execute(
            "SELECT work_id, kind FROM agentd_work ORDER BY work_id").fetchall())
    # every occurrence either member fired is one row, created by exactly one of them
    assert [work_id for work_id, _ in rows] == sorted(set(attempted)) and {kind for _, kind in rows} == {"schedule"}
    assert created.count(True) == len(rows) and len(attempted) == 6
    assert len(set(attempted)) < len(attempted)  # the members fired the same occurrences
    assert all(int(k.rsplit(".", 1)[1]) % 300 == 0 for k in attempted)  # keyed by the occurrence's minute


def _cfg():

    return load_config(["--intelligence", "test", "--instruction", "nightly", "--mode", "schedule",
                             "--cron", "*/5 * * * *"], env={})


async def test_cancel_ends_a_queued_item_at_once_and_a_running_one_through_its_owner(pg_dsn):
    from agentd.cluster.work import request_cancel

    log = EventLog(sink=lambda line: None)
    started = trio.Event()
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1)
        await enqueue(store, "queued", "spawn", {"instruction": "x"}, not_before=4_000_000_000.0)
        assert await request_cancel(store, "queued") is True
        seen = await view(store, "queued")
        assert seen is not None and seen.status == "done"
        run = await store.read_run("queued")
        assert run is not None and run.summary.status == "cancelled"
        assert await request_cancel(store, "queued") is False  # done is done
        assert await request_cancel(store, "nope") is False

        async def execute(item: WorkItem, journal: FencedJournal) -> None:
            await journal.append(item.work_id, [RunStarted("d", "x")])
            started.set()
            await trio.sleep_forever()

        member = Member(Queue(store, "m0", None, capacity=1), execute, log, ttl=1.5)
        await enqueue(store, "running", "spawn", {"instruction": "x"})
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(member.serve)
                await started.wait()
                assert await request_cancel(store, "running") is True
                async def cancelled() -> bool:
                    seen = await view(store, "running")
                    return seen is not None and seen.status == "done"

                await until(cancelled, timeout=30, what="the running item done")
                nursery.cancel_scope.cancel()
        run = await store.read_run("running")
        assert run is not None and run.summary.status == "cancelled"
        assert [e.record.KIND for e in run.entries] == ["claim.taken", "run.started", "run.ended"]


async def test_finishes_at_once_share_one_statement_and_a_lost_lease_refuses_only_its_own(pg_dsn):
    """Concurrent finishes of one member are committed together (group commit); each is fenced on its own
    lease: the one whose lease another member took raises LeaseLost naming that member, and changes nothing;
    the others end done."""
    clock = WallClock()
    async with AsyncExitStack() as stack:
        a_store, b_store = await _stores(stack, pg_dsn, 2, clock)
        a, b = Queue(a_store, "a", None, 8), Queue(b_store, "b", None, 8)
        for i in range(6):
            await enqueue(a_store, f"w{i}", "spawn", {"instruction": "go"})
        items = await a.claim(6, ttl=10)
        assert [i.work_id for i in items] == [f"w{i}" for i in range(6)]
        assert len({i.lease.token for i in items}) == 6 and all(i.attempt == 1 for i in items)
        clock.now += 11  # every lease expired; b re-takes the first item only
        [taken] = await b.claim(1, ttl=10)
        assert taken.work_id == "w0" and taken.attempt == 2
        refused: list[LeaseLost] = []

        async def finish(item: WorkItem) -> None:
            try:
                await a.finish(item.lease)
            except LeaseLost as exc:
                refused.append(exc)

        async with trio.open_nursery() as nursery:
            for item in items:
                nursery.start_soon(finish, item)
        assert [e.work for e in refused] == ["w0"] and refused[0].new_owner == "b"
        assert refused[0].new_token == taken.lease.token
        assert a.finisher.batches == 6 and a.finisher.groups < 6  # shared
        views = {i.work_id: await view(a_store, i.work_id) for i in items}
        assert {k for k, v in views.items() if v is not None and v.status == "done"} == {f"w{i}" for i in range(1, 6)}
        assert views["w0"] is not None and views["w0"].status == "open" and views["w0"].owner == "b"
        run = await a_store.read_run("w0")
        assert run is not None
        assert [(e.record.KIND, e.seq) for e in run.entries] == [("claim.taken", 0), ("claim.taken", 1)]
        assert [e.record.attempt for e in run.entries if isinstance(e.record, ClaimTaken)] == [1, 2]
        await b.finish(taken.lease)
        assert (await view(a_store, "w0")).status == "done"  # type: ignore[union-attr]
