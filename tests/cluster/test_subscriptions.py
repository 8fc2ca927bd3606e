"""Subscriptions owned by one member at a time, on a real PostgreSQL: a lease that expires is taken over with a
higher fencing token, the old owner can no longer record a wake, shares spread the subscriptions, and the owner
loop watches exactly what its member holds and wakes once for a change made while nobody owned it.

The MCP server here is a small in-memory stand-in (:class:`Resources`): what is under test is who subscribes
and who wakes, through the real watcher (agentd.modes.watch) and the real database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

import attrs
import pytest
import trio

from agentd.cluster.errors import LeaseLost
from agentd.cluster.store import PgJournal, open_pg_journal
from agentd.cluster.subscriptions import Subscriptions, scope_of, share
from agentd.cluster.work import Queue
from agentd.modes.clustered import ClusterReactive, digest_of
from agentd.modes.watch import Watcher
from agentd.telemetry.events import EventLog
from tests.journal.helpers import WallClock
from tests.postgres import PASSWORD
from tests.waiting import until

SCOPE = scope_of("WATCH the counter")


async def _stores(stack: AsyncExitStack, dsn: str, n: int, clock: WallClock | None = None) -> list[PgJournal]:
    extra = {"clock": clock, "lease_clock": clock} if clock is not None else {}
    return [await stack.enter_async_context(open_pg_journal(dsn, PASSWORD, **extra)) for _ in range(n)]


def test_shares_add_up_to_every_subscription():
    assert share(0, 4, 8) == 0
    assert share(1, 4, 8) == 1 and share(3, 4, 8) == 2 and share(6, 4, 12) == 2
    assert share(5, 4, 0) == 5  # alone (its own heartbeat not in yet): all of them
    for total in range(0, 20):
        for caps in ((4,), (4, 4), (1, 2, 3), (4, 4, 4, 4)):
            assert sum(share(total, c, sum(caps)) for c in caps) >= total


async def test_an_expired_lease_is_taken_over_with_a_higher_token_and_the_last_digest(pg_dsn):
    clock = WallClock()
    async with AsyncExitStack() as stack:
        a_store, b_store = await _stores(stack, pg_dsn, 2, clock)
        a, b = Subscriptions(a_store, SCOPE, "a", 4), Subscriptions(b_store, SCOPE, "b", 4)
        await a.add([("srv", "test://counter")], "config")
        await b.add([("srv", "test://counter")], "config")  # declared by both: one row
        assert (await a.heartbeat([], ttl=10))[1] == 1
        [held] = await a.claim(1, ["test://counter"], ttl=10)
        assert held.digest is None and held.origin == "config" and held.server == "srv"
        await a.record(held, "d1")
        assert await b.claim(1, ["test://counter"], ttl=10) == []  # a's lease is live
        clock.now += 5
        assert await a.heartbeat([held.token], ttl=10) == ({held.token}, 1)  # renewed to now + 10
        clock.now += 8
        assert await b.claim(1, ["test://counter"], ttl=10) == []  # still a's
        clock.now += 3  # past the renewed expiry: a stopped renewing (dead, paused, cut off)
        [taken] = await b.claim(1, ["test://counter"], ttl=10)
        assert taken.token > held.token and taken.digest == "d1"  # the new owner compares with a's last wake
        kept, _ = await a.heartbeat([held.token], ttl=10)
        assert kept == set()  # a learns it lost the subscription
        # a member that does not declare a URI never takes it
        c = Subscriptions(b_store, SCOPE, "c", 4)
        clock.now += 30
        assert await c.claim(1, [], ttl=10) == []


async def test_an_expired_lease_nobody_took_is_lost_for_its_owner_too(pg_dsn):
    """An owner that could not renew in time subscribes again as a new owner (and reads after subscribing)."""
    clock = WallClock()
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1, clock)
        a = Subscriptions(store, SCOPE, "a", 4)
        await a.add([(None, "test://x")], "self")
        [held] = await a.claim(1, [], ttl=10)
        clock.now += 11
        assert (await a.heartbeat([held.token], ttl=10))[0] == set()
        with pytest.raises(LeaseLost):
            await a.record(held, "d2")
        [again] = await a.claim(1, [], ttl=10)
        assert again.token > held.token


async def test_an_old_owner_whose_lease_was_taken_cannot_record_a_wake(pg_dsn):
    clock = WallClock()
    async with AsyncExitStack() as stack:
        a_store, b_store = await _stores(stack, pg_dsn, 2, clock)
        a, b = Subscriptions(a_store, SCOPE, "a", 4), Subscriptions(b_store, SCOPE, "b", 4)
        await a.add([(None, "test://x")], "self")
        [old] = await a.claim(1, [], ttl=10)
        await a.record(old, "d1")
        clock.now += 11
        [new] = await b.claim(1, [], ttl=10)
        with pytest.raises(LeaseLost, match="was lost"):
            await a.record(old, "d2")  # the old owner's wake of the same change is refused
        with pytest.raises(LeaseLost):
            await a.record(old, "d2", wake=False)
        await b.record(new, "d2")
        rows = await a_store.db.call(lambda conn: conn.execute(
            "SELECT owner, token, digest, wakes FROM agentd_subscriptions").fetchall())
        assert rows == [("b", new.token, "d2", 2)]  # one wake each, by the owner of the time
        await a.release([old])  # handing back a lease that is no longer ours changes nothing
        rows = await a_store.db.call(lambda conn: conn.execute("SELECT owner FROM agentd_subscriptions").fetchall())
        assert rows == [("b",)]


async def test_the_agents_own_subscription_is_deleted_by_unsubscribe_but_a_declared_one_stays(pg_dsn):
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1)
        a = Subscriptions(store, SCOPE, "a", 4)
        await a.add([("srv", "test://declared")], "config")
        await a.add([(None, "test://mine")], "self")
        await a.add([(None, "test://declared")], "self")  # already declared: stays a declared one
        assert await a.remove("test://declared") is False
        assert await a.remove("test://mine") is True
        assert await a.remove("test://mine") is False
        rows = await store.db.call(lambda conn: conn.execute(
            "SELECT uri, origin FROM agentd_subscriptions").fetchall())
        assert rows == [("test://declared", "config")]


# --- the owner loop, with the real watcher ----------------------------------------------------------------------


@attrs.frozen
class _Update:
    uri: str
    server: str


@attrs.frozen
class _Read:
    server: str
    contents: Sequence[Mapping[str, Any]]


@attrs.define(eq=False)
class Resources:
    """A stand-in MCP server: resource texts by URI; every change is pushed to the pools subscribed to it."""

    texts: dict[str, str] = attrs.field(factory=dict)
    pools: list[_Pool] = attrs.field(factory=list)

    def pool(self) -> _Pool:
        pool = _Pool(self)
        self.pools.append(pool)
        return pool

    def set(self, uri: str, text: str) -> None:
        self.texts[uri] = text
        for pool in self.pools:
            if uri in pool.subscribed:
                pool.send.send_nowait(_Update(uri, "srv"))


@attrs.define(eq=False)
class _Pool:
    resources: Resources
    subscribed: set[str] = attrs.field(factory=set)
    send: trio.MemorySendChannel[Any] = attrs.field(init=False)
    receive: trio.MemoryReceiveChannel[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel(100)

    async def subscribe(self, uri: str, server: str | None = None) -> bool:
        self.subscribed.add(uri)
        return True

    async def unsubscribe(self, uri: str, server: str | None = None) -> None:
        self.subscribed.discard(uri)

    async def read_resource(self, uri: str, server: str | None = None) -> _Read:
        return _Read("srv", [{"uri": uri, "text": self.resources.texts.get(uri, "")}])

    def updates(self) -> trio.MemoryReceiveChannel[Any]:
        return self.receive


@attrs.define(eq=False)
class _Running:
    name: str
    reactive: ClusterReactive
    pool: _Pool
    scope: trio.CancelScope
    woke: list[str]


async def _wait_for(condition: Any, what: str, timeout: float = 20) -> None:
    await until(condition, timeout=timeout, what=what)


async def _start(nursery: trio.Nursery, store: PgJournal, resources: Resources, name: str, uris: list[str],
                 ttl: float) -> _Running:
    log = EventLog(sink=lambda line: None)
    pool = resources.pool()
    woke: list[str] = []
    reactive = ClusterReactive(Subscriptions(store, SCOPE, name, 4), log, ttl)
    scope = trio.CancelScope()
    watcher = Watcher(pool, lambda uri, server: woke.append(uri), None, log)

    async def member(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            async with trio.open_nursery() as inner:
                await inner.start(watcher.run)
                await reactive.declare([("srv", uri) for uri in uris])
                await inner.start(reactive.serve, watcher, watcher.route)
                task_status.started()

    await nursery.start(member)
    return _Running(name, reactive, pool, scope, woke)


async def test_one_member_watches_each_subscription_and_the_next_owner_wakes_once_for_a_missed_change(pg_dsn):
    ttl = 1.5
    resources = Resources({"test://counter": "0"})
    async with AsyncExitStack() as stack:
        stores = await _stores(stack, pg_dsn, 2)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                members = [await _start(nursery, s, resources, f"m{i}", ["test://counter"], ttl)
                           for i, s in enumerate(stores)]
                await _wait_for(lambda: any(m.reactive.held for m in members), "an owner")
                await trio.sleep(ttl)  # real time: a few more lease ticks in the real database: nobody else takes it
                [owner] = [m for m in members if m.reactive.held]
                [other] = [m for m in members if m is not owner]
                assert owner.pool.subscribed == {"test://counter"} and other.pool.subscribed == set()
                resources.set("test://counter", "1")
                await _wait_for(lambda: owner.woke, "the owner's wake")
                read = await owner.pool.read_resource("test://counter")
                assert await owner.reactive.record("test://counter", read.contents) is True
                assert other.woke == []
                # The owner dies; the counter changes before anyone owns the subscription again.
                resources.pools.remove(owner.pool)
                resources.set("test://counter", "2")
                owner.scope.cancel()
                await _wait_for(lambda: other.woke, "the next owner's wake")
                assert other.woke == ["test://counter"] and other.pool.subscribed == {"test://counter"}
                # the old owner's wake of the same change is refused (fenced), the new owner's recorded
                read = await other.pool.read_resource("test://counter")
                assert await owner.reactive.record("test://counter", read.contents) is False
                assert await other.reactive.record("test://counter", read.contents) is True
                await trio.sleep(ttl)  # real time: a lease's length in the real database for a wrong wake to show
                assert other.woke == ["test://counter"] and len(owner.woke) == 1  # once each, no more
                nursery.cancel_scope.cancel()
        rows = await stores[0].db.call(lambda conn: conn.execute(
            "SELECT digest, wakes FROM agentd_subscriptions").fetchall())
        assert rows == [(digest_of(read.contents), 2)]


async def test_members_spread_subscriptions_within_their_shares(pg_dsn):
    ttl = 1.5
    uris = [f"test://r{i}" for i in range(4)]
    resources = Resources({uri: "0" for uri in uris})
    async with AsyncExitStack() as stack:
        stores = await _stores(stack, pg_dsn, 2)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                first = await _start(nursery, stores[0], resources, "m0", uris, ttl)
                await _wait_for(lambda: len(first.reactive.held) == 4, "the first member owning all four")
                second = await _start(nursery, stores[1], resources, "m1", uris, ttl)
                await _wait_for(lambda: len(first.reactive.held) == len(second.reactive.held) == 2,
                                "two each once the second member takes part")
                assert set(first.reactive.held).isdisjoint(second.reactive.held)
                assert first.pool.subscribed == set(first.reactive.held)
                assert second.pool.subscribed == set(second.reactive.held)
                nursery.cancel_scope.cancel()
        # members that stop hand their leases back at once
        rows = await stores[0].db.call(lambda conn: conn.execute(
            "SELECT count(*) FROM agentd_subscriptions WHERE owner IS NOT NULL").fetchone())
        assert rows == (0,)


async def test_a_subscription_no_longer_declared_is_handed_back(pg_dsn):
    """A reload that drops a ``--subscribe`` URI: its owner unsubscribes and frees the row."""
    ttl = 1.5
    uris = ["test://kept", "test://dropped"]
    resources = Resources({uri: "0" for uri in uris})
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                member = await _start(nursery, store, resources, "m0", uris, ttl)
                await _wait_for(lambda: member.pool.subscribed == set(uris), "both subscribed")
                await member.reactive.declare([("srv", "test://kept")])
                await _wait_for(lambda: member.pool.subscribed == {"test://kept"}, "the dropped one unsubscribed")
                assert member.reactive.held == ["test://kept"]
                owners = await store.db.call(lambda conn: conn.execute(
                    "SELECT uri, owner FROM agentd_subscriptions ORDER BY uri").fetchall())
                assert owners == [("test://dropped", None), ("test://kept", "m0")]
                nursery.cancel_scope.cancel()


async def test_a_self_scheduled_run_is_one_work_item_due_later(pg_dsn):
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1)
        reactive = ClusterReactive(Subscriptions(store, SCOPE, "m0", 4), EventLog(sink=lambda line: None), 5.0,
                                   {"output_contract": "json"})
        assert await reactive.schedule(3600, "check again") is True
        queue = Queue(store, "m1", None, 4)
        assert await queue.claim(4, ttl=5) == []  # not due yet: nobody runs it before its time
        rows = await store.db.call(lambda conn: conn.execute(
            "SELECT kind, payload, not_before - created_at FROM agentd_work").fetchall())
        [(kind, payload, delay)] = rows
        assert kind == "schedule" and abs(delay - 3600) < 1
        assert payload == '{"output_contract":"json","instruction":"check again"}'


async def test_the_agents_own_requests_become_cluster_rows(pg_dsn):
    """What a run queued with the self-tools: its subscriptions and scheduled runs are the cluster's, not this
    process's (nothing is watched or timed here until the member owns or claims them)."""
    from agentd.agent.budgets import Limits
    from agentd.modes.runs import DaemonRuns
    from agentd.modes.selftools import ScheduleRequest, SelfRequests, SubscriptionRequest

    resources = Resources({"test://mine": "0"})
    log = EventLog(sink=lambda line: None)
    async with AsyncExitStack() as stack:
        [store] = await _stores(stack, pg_dsn, 1)
        reactive = ClusterReactive(Subscriptions(store, SCOPE, "m0", 4), log, 5.0)

        async def no_run(*args: Any) -> Any:
            raise AssertionError("nothing runs here")

        pool = resources.pool()
        runs = DaemonRuns(no_run, base_run_id="r", limits=Limits(), log=log, shared=reactive)
        runs.watcher = Watcher(pool, lambda uri, server: None, None, log)
        await runs.apply(SelfRequests([SubscriptionRequest("subscribe", "test://mine"),
                                       SubscriptionRequest("subscribe", "test://gone"),
                                       SubscriptionRequest("unsubscribe", "test://gone"),
                                       SubscriptionRequest("unsubscribe", "test://never")],
                                      [ScheduleRequest(60.0, "look again")]), log)
        assert pool.subscribed == set() and not runs.watcher.watching("test://mine")
        subs = await store.db.call(lambda conn: conn.execute(
            "SELECT uri, origin, owner FROM agentd_subscriptions").fetchall())
        work = await store.db.call(lambda conn: conn.execute("SELECT kind, payload FROM agentd_work").fetchall())
    assert subs == [("test://mine", "self", None)]
    assert work == [("schedule", '{"instruction":"look again"}')]


async def test_a_version_1_schema_is_migrated_forward(pg_dsn):
    import psycopg

    from agentd.cluster.store import open_database
    from tests.journal import released_schemas

    with psycopg.connect(pg_dsn, password=PASSWORD, autocommit=True) as conn:
        for statement in released_schemas.statements(released_schemas.POSTGRES_V1):
            conn.execute(statement.encode())
        conn.execute("INSERT INTO agentd_meta (key, value) VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO agentd_work (work_id, kind, payload, created_at, not_before) "
                     "VALUES ('kept', 'spawn', '{}', 0, 0)")
    db = await open_database(pg_dsn, PASSWORD, "x", migrate=True)
    try:
        rows = await db.call(lambda conn: (
            conn.execute("SELECT value FROM agentd_meta WHERE key = 'schema_version'").fetchone(),
            conn.execute("SELECT work_id FROM agentd_work").fetchall(),
            conn.execute("SELECT count(*) FROM agentd_subscriptions").fetchone()))
    finally:
        await db.aclose()
    assert rows == (("2",), [("kept",)], (0,))
