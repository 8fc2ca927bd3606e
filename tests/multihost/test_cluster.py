"""A cluster on several hosts: an agentd member in each of several network namespaces, the shared PostgreSQL
in the root namespace on the hosts' network, a parent agentd on a host of its own.

Per test (tests/peers/netns.py, ``root_link=True``): a throwaway PostgreSQL of the test's own listens on the
root namespace's address on the bridge, so a member's database traffic crosses its cable and ``link_down``
cuts it off from the database as from the other hosts. The scripted model gateway and the MCP server that
counts tool calls (tests/durable/peer.py: ``charge`` is not idempotent) run in this process and are reached
from each host through a loopback relay (``Host.forward``), around the cables: a cut member still gets its
model's answer and could call its tools, so what it does after the cut shows in the journal and the counter.

Every child run here asks its model once (``CHILD-<key>``), charges ``<key>`` once, and ends with
``done <key>``; the counter proves each charge happened exactly once.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agentd.cluster.db import IDLE_IN_TRANSACTION_TIMEOUT, Database
from agentd.cluster.errors import ClusterUnavailable
from agentd.cluster.store import PgJournal, check_fence, open_pg_journal
from agentd.cluster.work import Queue, enqueue
from agentd.journal.records import ClaimTaken
from tests import postgres
from tests.cluster.leases import last_claimed_at, lease_expiry_past, takeover
from tests.durable.peer import CountingPeer, counting_peer
from tests.integration.agents import AGENTD, ROOT, run_agentd, text_of
from tests.peers import netns
from tests.peers.gateway import (
    RecordedRequest,
    ScriptedGateway,
    scripted_gateway,
    text,
    tool_call,
    tool_calls,
)
from tests.selfmcp.certs import Pki, make_pki
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

TOKEN_ENV = {"PGPASSWORD": postgres.PASSWORD}


@pytest.fixture(autouse=True)
def _netns_available() -> None:
    netns.require()


# --- the model: child runs and the parent ----------------------------------------------------------------------


def _user_text(request: RecordedRequest) -> str:
    return " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")


def child_key(request: RecordedRequest) -> str | None:
    """``CHILD-<key>`` in the run's instruction (None: not a child run)."""
    user = _user_text(request)
    if "CHILD-" not in user:
        return None
    return user.split("CHILD-", 1)[1].split()[0]


def child_reply(request: RecordedRequest) -> dict[str, Any]:
    """A child run: charge its key once, then answer ``done <key>``."""
    key = child_key(request)
    assert key is not None
    if not any(m.get("role") == "tool" for m in request.messages):
        return tool_call("pay__charge", {"key": key})
    return text(f"done {key}")


@attrs.define(eq=False)
class Model:
    """The gateway's replies: child runs as :func:`child_reply`; a key in ``hold`` has its FIRST model request
    held until the event is set (that run is in flight on its first owner for as long as the test says);
    ``parent`` answers the parent's requests."""

    hold: dict[str, trio.Event] = attrs.field(factory=dict)
    parent: Callable[[RecordedRequest], dict[str, Any]] | None = None
    asked: Counter[str] = attrs.field(factory=Counter)

    def __call__(self, request: RecordedRequest) -> dict[str, Any]:
        key = child_key(request)
        if key is None:
            assert self.parent is not None, _user_text(request)
            return self.parent(request)
        self.asked[key] += 1
        if key in self.hold and self.asked[key] == 1:
            return {**child_reply(request), "wait": self.hold[key]}
        return child_reply(request)


# --- the cluster on its hosts ----------------------------------------------------------------------------------


@attrs.define(eq=False)
class Member:
    host: netns.Host
    proc: trio.Process
    log: Path

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == event]

    def claimed(self) -> set[str]:
        return {str(e["work"]) for e in self.named("cluster.claimed")}

    @property
    def url(self) -> str:
        return str(self.named("serve.start")[0]["urls"][0])

    def kill(self) -> None:
        netns.kill_group(self.proc.pid)


def _up(member: Member, *events: str) -> bool:
    """The member still runs (else fail with its log's tail) and has logged each of ``events``."""
    assert member.proc.poll() is None, member.log.read_text()[-3000:]
    return all(member.named(event) for event in events)


@attrs.define(eq=False)
class Site:
    net: netns.Network
    pg: postgres.PgServer
    dsn: str
    store: PgJournal
    gw: ScriptedGateway
    peer: CountingPeer
    pki: Pki
    members: list[Member]
    tmp_path: Path

    @property
    def parent_host(self) -> netns.Host:
        return self.net.hosts[-1]

    async def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """One query on this process's own connection (retried while the database restarts)."""
        with trio.fail_after(60):
            while True:
                try:
                    return await self.store.db.call(lambda conn: conn.execute(query, args).fetchall(), "test query")
                except ClusterUnavailable:
                    await trio.sleep(0.2)  # real time: a real PostgreSQL server is restarting

    async def status_is(self, work_id: str, status: str) -> bool:
        return (await self.sql("SELECT status FROM agentd_work WHERE work_id = %s", work_id))[0][0] == status

    async def done(self) -> int:
        return int((await self.sql("SELECT count(*) FROM agentd_work WHERE status = 'done'"))[0][0])

    async def wait_done(self, count: int, timeout: float) -> None:
        async def enough() -> bool:
            return await self.done() >= count

        await until(enough, timeout=timeout, what=f"{count} items done")

    async def owners(self, work_id: str) -> list[str]:
        run = await self.store.read_run(work_id)
        return [e.record.owner for e in run.entries if isinstance(e.record, ClaimTaken)] if run else []

    def member_of(self, work_id: str) -> Member:
        [member] = [m for m in self.members if work_id in m.claimed()]
        return member

    def charges(self) -> Counter[str]:
        return Counter(str(c["key"]) for c in self.peer.executed if c["name"] == "charge")


async def _start_member(stack: AsyncExitStack, site_parts: dict[str, Any], host: netns.Host, index: int, *,
                        ttl: float, capacity: int) -> Member:
    pki: Pki = site_parts["pki"]
    model = await stack.enter_async_context(host.forward(site_parts["gw"].port))
    pay = await stack.enter_async_context(host.forward(int(site_parts["peer"].origin.rsplit(":", 1)[1])))
    argv = [*AGENTD, "--cluster", site_parts["dsn"], "--cluster-lease-ttl", f"{ttl:g}s",
            "--cluster-capacity", str(capacity), "--intelligence", f"http://127.0.0.1:{model}/v1",
            "--mcp", f"pay=http://127.0.0.1:{pay}/mcp", "--deadline", "120s", "--drain-timeout", "2",
            "--serve-mcp", f"https://{host.addr}:0/mcp", "--serve-cert", str(pki.server.cert),
            "--serve-key", str(pki.server.key), "--serve-client-ca", str(pki.ca)]
    # A burst of async spawns from the parent is queued (--serve-max-queued, default 1000): the defaults do.
    log_path = site_parts["tmp_path"] / f"member{index}.stderr"
    log = stack.enter_context(open(log_path, "wb"))
    proc = await stack.enter_async_context(host.run(argv, env=TOKEN_ENV, stdout=subprocess.DEVNULL, stderr=log,
                                                    cwd=str(ROOT)))
    return Member(host, proc, log_path)


async def database_on(net: netns.Network, stack: AsyncExitStack) -> tuple[postgres.PgServer, str]:
    """A PostgreSQL of this test's own on the root namespace's address on ``net`` (the hosts log in over their
    cables), stopped and removed when ``stack`` closes; and the DSN of a fresh database on it."""
    assert net.root_addr is not None
    pg = await trio.to_thread.run_sync(functools.partial(
        postgres.start_server, listen=(net.root_addr,), allow=(net.subnet,)))

    async def close() -> None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(pg.close)

    stack.push_async_callback(close)
    return pg, pg.dsn(pg.new_database())


@asynccontextmanager
async def site(tmp_path: Path, model: Model, *, members: int, ttl: float, capacity: int = 4
               ) -> AsyncIterator[Site]:
    """``members`` agentd members on hosts of their own plus a parent host, all joined, with the database up."""
    async with AsyncExitStack() as stack:
        net = await stack.enter_async_context(netns.network(members + 1, root_link=True))
        pg, dsn = await database_on(net, stack)
        store = await stack.enter_async_context(open_pg_journal(dsn, postgres.PASSWORD))
        gw = await stack.enter_async_context(scripted_gateway(default=model))
        peer = await stack.enter_async_context(counting_peer())
        pki = make_pki(tmp_path / "pki", names=tuple(h.addr for h in net.hosts))
        parts = {"pki": pki, "gw": gw, "peer": peer, "dsn": dsn, "tmp_path": tmp_path}
        started = [await _start_member(stack, parts, host, i, ttl=ttl, capacity=capacity)
                   for i, host in enumerate(net.hosts[:members])]
        for member in started:
            await until(lambda m=member: _up(m, "cluster.joined", "serve.start"), timeout=90, what="the member up")
        yield Site(net, pg, dsn, store, gw, peer, pki, started, tmp_path)


def _parent_config(s: Site) -> Path:
    config = s.tmp_path / "parent.yaml"
    tls = f"{{ca: {s.pki.ca}, cert: {s.pki.client.cert}, key: {s.pki.client.key}}}"
    # the members serve on the test network's private addresses: egress there is opt-in
    config.write_text(f"{netns.EGRESS_ALLOW}\nmcp_servers:\n" + "".join(
        f"  - name: w{i}\n    url: {m.url}\n    call_timeout: 30s\n    tls: {tls}\n" for i, m in enumerate(s.members)))
    return config


async def run_parent(s: Site, timeout: float = 120) -> dict[str, Any]:
    """The parent agentd on its own host, its model spawning through the members' served self-MCP."""
    async with s.parent_host.forward(s.gw.port) as model:
        argv = ["--config", str(_parent_config(s)), "--intelligence", f"http://127.0.0.1:{model}/v1",
                "--instruction", "PARENT: spawn the batch", "--deadline", f"{timeout:g}s"]
        done = await run_agentd(argv, prefix=s.parent_host.exec_prefix, timeout=timeout + 10)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return dict(json.loads(done.stdout))


def spawning_parent(keys: Sequence[str], members: int, per_turn: int = 50) -> Callable[[RecordedRequest],
                                                                                        dict[str, Any]]:
    """The parent's model: async spawns of ``CHILD-<key>`` for every key, ``per_turn`` calls a turn, spread
    round-robin over the members' servers (as a load balancer would), then a final answer."""

    def reply(request: RecordedRequest) -> dict[str, Any]:
        sent = sum(1 for m in request.messages if m.get("role") == "tool")
        batch = keys[sent:sent + per_turn]
        if not batch:
            return text(f"spawned {sent}")
        return tool_calls(*((f"w{(sent + i) % members}__subagent_spawn",
                             {"instruction": f"CHILD-{key} charge it", "async": True})
                            for i, key in enumerate(batch)))

    return reply


# --- scenarios -------------------------------------------------------------------------------------------------


async def test_200_async_spawns_spread_over_3_members_and_every_tool_call_happens_once(tmp_path: Path) -> None:
    keys = [f"k{i:03}" for i in range(200)]
    model = Model(parent=spawning_parent(keys, 3))
    with trio.fail_after(170):
        async with site(tmp_path, model, members=3, ttl=10, capacity=6) as s:
            result = await run_parent(s)
            assert result["status"] == "completed", result
            await s.wait_done(200, 120)
            rows = await s.sql("SELECT w.work_id, w.attempts, r.status FROM agentd_work w "
                               "JOIN agentd_runs r ON r.run_id = w.work_id")
            shares = [len(m.claimed()) for m in s.members]
    assert len(rows) == 200 and all(work_id.startswith("cluster.") for work_id, _, _ in rows)
    assert {status for _, _, status in rows} == {"completed"}
    assert {attempts for _, attempts, _ in rows} == {1}, "a spawn was claimed twice"
    assert sum(shares) == 200 and all(share > 0 for share in shares), shares
    assert s.charges() == Counter({key: 1 for key in keys})
    assert len(s.peer.received) == 200


async def test_a_sigkilled_members_work_finishes_elsewhere_within_ttl_plus_2s(tmp_path: Path) -> None:
    """The killed member's lease on "held" expires at most ``ttl`` after the kill; another member takes it over
    within ``takeover(ttl)`` (2 s) of that expiry, never before, by the database's clock (tests/cluster/leases.py:
    the test's own pace and the rerun's on a loaded machine are not part of the bound)."""
    ttl = 3.0
    held = trio.Event()  # never set: the first owner of "held" is killed while its model call waits
    model = Model(hold={"held": held})
    with trio.fail_after(120):
        async with site(tmp_path, model, members=3, ttl=ttl) as s:
            await enqueue(s.store, "held", "run", {"instruction": "CHILD-held charge it"})
            for i in range(8):
                await enqueue(s.store, f"other{i}", "run", {"instruction": f"CHILD-other{i} charge it"})
            await until(lambda: model.asked["held"] >= 1, timeout=30, what="held's model call")
            victim = s.member_of("held")

            async def kill() -> None:
                victim.kill()
                await victim.proc.wait()

            earliest, latest = await lease_expiry_past(s.store, "held", kill, ttl)
            await until(lambda: s.status_is("held", "done"), timeout=60, what="held done")
            moved_at = await last_claimed_at(s.store, "held")
            await s.wait_done(9, 60)
            owners = await s.owners("held")
            ended = await s.sql("SELECT run_id, status FROM agentd_runs WHERE run_id = 'held' OR run_id LIKE 'other%%'")
    assert earliest <= moved_at <= latest + takeover(ttl), (moved_at - earliest, latest - earliest)
    assert len(owners) == 2 and owners[0] != owners[1], owners
    assert {status for _, status in ended} == {"completed"} and len(ended) == 9
    charges = s.charges()
    assert charges["held"] == 1
    # An item killed between committing its step and learning the charge's outcome is not charged again (the
    # call is not idempotent): at most once for every other item.
    assert set(charges) <= {"held", *(f"other{i}" for i in range(8))} and max(charges.values()) == 1, charges


async def test_a_cut_off_owner_loses_the_work_and_commits_nothing_when_its_link_returns(tmp_path: Path) -> None:
    ttl = 3.0
    release = trio.Event()
    model = Model(hold={"cut": release})
    with trio.fail_after(150):
        async with site(tmp_path, model, members=2, ttl=ttl) as s:
            await enqueue(s.store, "cut", "run", {"instruction": "CHILD-cut charge it"})
            await until(lambda: model.asked["cut"] >= 1, timeout=30, what="cut's model call")
            old = s.member_of("cut")

            async def cut() -> None:
                old.host.link_down()

            earliest, latest = await lease_expiry_past(s.store, "cut", cut, ttl)
            await until(lambda: s.status_is("cut", "done"), timeout=60, what="cut done")
            moved_at = await last_claimed_at(s.store, "cut")
            before = await s.store.read_run("cut")
            assert s.charges() == Counter({"cut": 1})  # by the new owner
            release.set()  # the old owner's model answers now: charge the card (it cannot reach the database)
            # real time: the cut-off daemon (a real process) tries its charge and commit while its link is down
            await trio.sleep(1.0)
            old.host.link_up()
            await until(lambda: _up(old) and (old.named("cluster.fenced") or old.named("cluster.lease_lost")),
                        timeout=60, what="the old owner fenced")
            await trio.sleep(1.0)  # real time: a window for a (wrong) commit or charge of the real daemon to land
            after = await s.store.read_run("cut")
            owners = await s.owners("cut")
            finished = [e for e in old.named("cluster.finished") if e.get("work") == "cut"]
    # Taken over after the lease expired, by the database's clock; a cut inside a transaction may hold the lease
    # row's lock until the server ends that idle session (IDLE_IN_TRANSACTION_TIMEOUT after its last statement).
    assert earliest <= moved_at <= latest + takeover(ttl) + IDLE_IN_TRANSACTION_TIMEOUT, (moved_at - earliest,
                                                                                            latest - earliest)
    assert before is not None and after is not None and after.entries == before.entries
    assert len(owners) == 2 and owners[0] != owners[1], owners
    assert after.entries[-1].record.KIND == "run.ended"
    assert "done cut" in json.dumps(after.entries[-1].record.result)
    assert finished == []
    assert s.charges() == Counter({"cut": 1}) and len(s.peer.received) == 1


async def test_the_database_restarting_mid_load_loses_nothing(tmp_path: Path) -> None:
    keys = [f"r{i:02}" for i in range(60)]
    # The last three items' first model calls wait for the database to stop: the load cannot be over before it
    # (on a fast machine the other 57 may all be done by then), and those three answer while it is down.
    held = trio.Event()
    model = Model(parent=spawning_parent(keys, 3, per_turn=30), hold={key: held for key in keys[-3:]})
    with trio.fail_after(170):
        # Leases outlast the outage (the database's stop and start on a loaded machine): the work stays put.
        async with site(tmp_path, model, members=3, ttl=15) as s:
            result = await run_parent(s)
            assert result["status"] == "completed", result
            await s.wait_done(10, 60)
            await trio.to_thread.run_sync(s.pg.stop)  # mid-load: some done, some running, some queued
            stopped_with = len(s.peer.executed)
            held.set()
            await trio.sleep(2.0)  # real time: the real members run on without their database for a while
            await trio.to_thread.run_sync(s.pg.start)
            await s.wait_done(60, 120)
            rows = await s.sql("SELECT w.work_id, r.status FROM agentd_work w JOIN agentd_runs r "
                               "ON r.run_id = w.work_id")
            unavailable = [m for m in s.members if m.named("cluster.unavailable")]
            available = [m for m in s.members if m.named("cluster.available")]
    assert stopped_with < 60, "the load was over before the database stopped"
    assert len(rows) == 60 and {status for _, status in rows} == {"completed"}
    # The members noticed (once each), and each said so when the database was back.
    assert unavailable and available == unavailable
    assert all(len(m.named("cluster.unavailable")) == 1 for m in unavailable)
    assert s.charges() == Counter({key: 1 for key in keys})


async def test_a_subscription_wakes_exactly_one_member_also_after_its_owner_dies(tmp_path: Path) -> None:
    """Two members subscribe the same URI: one owns it (only it subscribes on the server) and an update wakes it
    alone. Its owner is SIGKILLed and the URI changes before its lease expires; the other member takes the
    subscription over, finds the change by reading after subscribing and wakes once; a later update wakes it
    alone too."""
    from tests.peers import launch

    wakes: list[str] = []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        wakes.append(_user_text(request))
        return text("seen")

    async def count_wakes(base: int) -> int:
        """The wakes since ``base`` once the first came (bounded), after a settle for any duplicate to show."""
        await until(lambda: len(wakes) > base, timeout=45, what="a wake")
        await trio.sleep(2.0)  # real time: a second wake of the same update would have asked its model by now
        return len(wakes) - base

    with trio.fail_after(180):
        async with AsyncExitStack() as stack:
            net = await stack.enter_async_context(netns.network(2, root_link=True))
            _, dsn = await database_on(net, stack)
            gw = await stack.enter_async_context(scripted_gateway(default=reply))
            peer = await stack.enter_async_context(launch.peer_server(launch.sdk_server_argv()))
            peer_port = int(peer.url.rsplit(":", 1)[1].split("/")[0])
            members = []
            for i, host in enumerate(net.hosts):
                model = await stack.enter_async_context(host.forward(gw.port))
                srv = await stack.enter_async_context(host.forward(peer_port))
                log_path = tmp_path / f"member{i}.stderr"
                log = stack.enter_context(open(log_path, "wb"))
                argv = [*AGENTD, "--cluster", dsn, "--cluster-lease-ttl", "3s", "--mode", "reactive",
                        "--instruction", "WATCH the counter", "--intelligence", f"http://127.0.0.1:{model}/v1",
                        "--mcp", f"srv={peer.url.replace(f':{peer_port}/', f':{srv}/', 1)}",
                        "--subscribe", "test://counter", "--debounce", "50ms"]
                proc = await stack.enter_async_context(host.run(argv, env=TOKEN_ENV, stdout=subprocess.DEVNULL,
                                                                stderr=log, cwd=str(ROOT)))
                members.append(Member(host, proc, log_path))
            # Every member is up; exactly one subscribed on the server (the owner).
            await until(lambda: all(_up(m, "cluster.joined") for m in members)
                        and any(m.named("trigger.armed") for m in members), timeout=60, what="one member armed")
            await trio.sleep(1.0)  # real time: both real members' subscription loops took part at least once
            armed = [m for m in members if m.named("trigger.armed")]
            assert len(armed) == 1, "both members subscribed on the server"
            woke: list[int] = []
            base = len(wakes)
            await launch.abump(peer.url)
            woke.append(await count_wakes(base))
            # The subscription's owner dies (the member that woke, the first if several did), and the counter
            # changes at once, while its lease is still live: nobody is subscribed to see it. The next owner
            # finds it by reading after subscribing.
            owner = next(m for m in members if m.named("run.end"))
            owner.kill()
            base = len(wakes)
            await launch.abump(peer.url)
            woke.append(await count_wakes(base))
            # A change after the take-over: pushed to the new owner alone.
            base = len(wakes)
            await launch.abump(peer.url)
            woke.append(await count_wakes(base))
            survivor = next(m for m in members if m is not owner)
            owned = survivor.named("cluster.subscription_owned")
    assert woke == [1, 1, 1], f"the updates woke {woke} members"
    assert owned and owned[-1]["uri"] == "test://counter"
    assert len(survivor.named("run.end")) == 2, "the later updates did not wake the surviving member"


async def test_an_owner_cut_off_inside_a_transaction_does_not_block_the_next_claim(tmp_path: Path) -> None:
    """A member whose link is cut (or that is paused) between two statements of a transaction leaves its
    server session idle in that transaction, holding its row locks: here the lease row that a fenced commit
    locks first (``check_fence``). The server must end that session within a bound, or no member can take
    the item over (each claim would wait on the lock until its statement time-out) for as long as the cut
    lasts. The member's connection is agentd's own (agentd.cluster.db.Database, its session settings), made
    from inside the cut host."""
    ttl = 2.0
    with trio.fail_after(90):
        await _claim_past_a_cut_transaction(ttl)


async def _claim_past_a_cut_transaction(ttl: float) -> None:
    async with AsyncExitStack() as stack:
        net = await stack.enter_async_context(netns.network(1, root_link=True))
        [host] = net.hosts
        _, dsn = await database_on(net, stack)
        store = await stack.enter_async_context(open_pg_journal(dsn, postgres.PASSWORD))
        await enqueue(store, "locked", "run", {"instruction": "CHILD-locked"})
        cut_db = Database(dsn, postgres.PASSWORD, "cut member")
        stack.push_async_callback(cut_db.aclose)

        def connect_from_the_host() -> None:
            with netns._inside(host.name):
                cut_db.run(lambda conn: conn.execute("SELECT 1"), "connect")

        await trio.to_thread.run_sync(connect_from_the_host)
        [item] = await Queue(PgJournal(cut_db), "cut", None, 1).claim(1, ttl)

        def begin_a_fenced_commit(conn: Any) -> None:
            conn.execute("BEGIN")
            check_fence(conn, item.lease)  # the lease row is locked until this transaction ends

        await cut_db.call(begin_a_fenced_commit, "begin")
        host.link_down()
        cut_at = trio.current_time()
        survivor = Queue(store, "survivor", None, 1)
        claimed = await until(lambda: survivor.claim(1, ttl), timeout=ttl + IDLE_IN_TRANSACTION_TIMEOUT + 10,
                              what="the item claimed past the cut transaction")
        took = trio.current_time() - cut_at
    assert [c.work_id for c in claimed] == ["locked"] and claimed[0].lease.token > item.lease.token
    assert took < ttl + IDLE_IN_TRANSACTION_TIMEOUT + 5, took
