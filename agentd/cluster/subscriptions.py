"""Subscriptions owned by one member at a time, and self-scheduled runs as cluster work (``--cluster``).

Why: every member of a cluster runs the same agent. If each subscribed to each ``--subscribe`` URI, one update
would wake every member. Instead each subscription is a row in ``agentd_subscriptions`` under a lease, as a work
item is (agentd.cluster.work), and only the member holding the lease subscribes on the MCP server and runs its
wakes. The rules, each one transaction:

- a row is keyed by the agent (:func:`scope_of`, its instruction) and the URI: ``--subscribe`` rows are inserted
  by every member that declares them (``ON CONFLICT DO NOTHING``) and claimed only by members that declare
  them; the ``subscribe`` self-tool inserts a row any member may claim, ``unsubscribe`` deletes it;
- :meth:`Subscriptions.heartbeat` (every ``ttl / 3``) marks the member as taking part, renews its leases and
  says which it LOST (taken, deleted, or expired: an expired lease is lost even when nobody took it yet, so its
  owner subscribes again as a new owner would);
- :meth:`Subscriptions.claim` takes free or expired rows (``FOR UPDATE SKIP LOCKED``) up to the member's share,
  each with a new fencing token from ``agentd_fence``;
- :meth:`Subscriptions.record` is a wake, fenced: it stores the digest of what the wake read only while the
  lease still carries the caller's token, and a wake whose record is refused does not run. Two members never
  run a wake for the same change: the one that recorded it ran it, and the next owner compares with it.

Failover: a new owner subscribes and reads after subscribing (agentd.reactive.watch.Watcher.watch with
``since``, the digest last recorded): contents that differ from the last recorded wake are one wake, so a change
made while nobody owned the subscription is processed once, at least. The failover time is the lease TTL (the
dead owner's lease expiring) plus one claim tick (``ttl / 3``) plus the subscribe and read.

Spread: a member claims up to its share ``ceil(subscriptions * capacity / capacity of the members taking
part)`` and hands back what it holds beyond it; the shares add up to at least the number of subscriptions, so
every subscription has a member with room for it.

Self-scheduled runs: :meth:`ClusterReactive.schedule` enqueues a ``schedule`` work item due ``after`` seconds
from now on the database's clock (agentd.cluster.work), so the run fires once in the cluster on whichever member
claims it, as a cron occurrence does.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import psycopg
import trio

from agentd.backoff import exponential
from agentd.cluster.errors import ClusterUnavailable, LeaseLost
from agentd.cluster.store import PgJournal
from agentd.cluster.work import enqueue_in
from agentd.events import EventLog
from agentd.journal.errors import JournalError
from agentd.reactive.shared import Notify
from agentd.reactive.watch import Origin, Watcher, content_digest

Conn = psycopg.Connection[Any]
#: Bound on handing leases back when the member stops (shielded).
RELEASE_GRACE: Final = 2.0
#: Backoff of the owner loop while the database is unreachable: base and cap in seconds.
RETRY_BASE: Final = 0.2
RETRY_CAP: Final = 5.0
#: The digest a wake records for a resource that does not exist (as the watcher's digest does).
MISSING: Final = "missing"

_ORIGINS: Final = {"config": Origin.CONFIG, "self": Origin.SELF}


def scope_of(instruction: str) -> str:
    """The agent a subscription belongs to across the cluster: members with the same instruction share it."""
    return hashlib.sha256(instruction.encode()).hexdigest()[:16]


def digest_of(contents: Sequence[Mapping[str, Any]] | None) -> str:
    return MISSING if contents is None else content_digest(list(contents))


@attrs.frozen
class SubLease:
    """A subscription this member holds: the row, its fencing token and the digest last recorded for it."""

    sub_id: str
    uri: str
    server: str | None
    origin: str  # config | self
    token: int
    digest: str | None


@attrs.define(eq=False)
class Subscriptions:
    """One member's side of ``agentd_subscriptions`` for one scope (see the module docstring)."""

    store: PgJournal
    scope: str
    member: str
    capacity: int

    def sub_id(self, uri: str) -> str:
        return f"{self.scope}:{uri}"

    async def add(self, entries: Sequence[tuple[str | None, str]], origin: str) -> None:
        """Insert rows for ``(server, uri)`` entries; existing rows stay as they are."""
        if not entries:
            return

        def work(conn: Conn) -> None:
            with conn.transaction():
                now = self.store.now_in(conn)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO agentd_subscriptions (sub_id, scope, uri, server, origin, created_at) "
                        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (sub_id) DO NOTHING",
                        [(self.sub_id(uri), self.scope, uri, server, origin, now) for server, uri in entries])

        await self.store.db.call(work, "subscribe")

    async def remove(self, uri: str) -> bool:
        """Delete the agent's own subscription of ``uri`` (a declared one stays); False when there was none."""
        row = await self.store.db.call(lambda conn: conn.execute(
            "DELETE FROM agentd_subscriptions WHERE sub_id = %s AND origin = 'self' RETURNING sub_id",
            (self.sub_id(uri),)).fetchone(), "unsubscribe")
        return row is not None

    async def heartbeat(self, tokens: Sequence[int], ttl: float) -> tuple[set[int], int]:
        """Take part for ``ttl`` more seconds and renew the live leases among ``tokens``: (the tokens kept, this
        member's share of the scope's subscriptions)."""

        def work(conn: Conn) -> tuple[set[int], int]:
            with conn.transaction():
                now = self.store.now_in(conn)
                conn.execute(
                    "INSERT INTO agentd_subscribers (scope, member_id, capacity, seen_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (scope, member_id) DO UPDATE SET capacity = excluded.capacity, "
                    "seen_at = excluded.seen_at", (self.scope, self.member, self.capacity, now))
                kept = {int(r[0]) for r in conn.execute(
                    "UPDATE agentd_subscriptions SET expires_at = %s WHERE owner = %s AND token = ANY(%s) "
                    "AND expires_at > %s RETURNING token", (now + ttl, self.member, list(tokens), now))}
                row = conn.execute(
                    "SELECT (SELECT count(*) FROM agentd_subscriptions WHERE scope = %(scope)s), "
                    "(SELECT coalesce(sum(capacity), 0) FROM agentd_subscribers WHERE scope = %(scope)s "
                    " AND seen_at > %(alive)s)", {"scope": self.scope, "alive": now - ttl}).fetchone()
            total, capacity = (int(row[0]), int(row[1])) if row is not None else (0, 0)
            return kept, share(total, self.capacity, capacity)

        return await self.store.db.call(work, "subscription heartbeat")

    async def claim(self, limit: int, declared: Sequence[str], ttl: float) -> list[SubLease]:
        """Take up to ``limit`` free or expired subscriptions this member may own (the agent's own ones and the
        ``declared`` URIs), each with a new fencing token."""
        if limit <= 0:
            return []
        ids = [self.sub_id(uri) for uri in declared]

        def work(conn: Conn) -> list[SubLease]:
            taken: list[SubLease] = []
            with conn.transaction():
                now = self.store.now_in(conn)
                rows = conn.execute(
                    "SELECT sub_id, uri, server, origin, digest FROM agentd_subscriptions "
                    "WHERE scope = %(scope)s AND (origin = 'self' OR sub_id = ANY(%(ids)s)) "
                    "AND (owner IS NULL OR expires_at <= %(now)s) ORDER BY created_at, sub_id LIMIT %(n)s "
                    "FOR UPDATE SKIP LOCKED", {"scope": self.scope, "ids": ids, "now": now, "n": limit}).fetchall()
                for sub_id, uri, server, origin, digest in rows:
                    row = conn.execute(
                        "UPDATE agentd_subscriptions SET owner = %s, token = nextval('agentd_fence'), "
                        "expires_at = %s WHERE sub_id = %s RETURNING token",
                        (self.member, now + ttl, sub_id)).fetchone()
                    assert row is not None
                    taken.append(SubLease(sub_id, uri, server, origin, int(row[0]), digest))
            return taken

        return await self.store.db.call(work, "subscription claim")

    async def record(self, lease: SubLease, digest: str, *, wake: bool = True) -> None:
        """Record a wake that read contents with ``digest`` (``wake`` False: only the digest seen on taking the
        subscription, when none was recorded yet), fenced: :class:`LeaseLost` and nothing written once the lease
        is not this member's live one."""

        def work(conn: Conn) -> bool:
            with conn.transaction():
                now = self.store.now_in(conn)
                if wake:
                    row = conn.execute(
                        "UPDATE agentd_subscriptions SET digest = %s, wakes = wakes + 1 WHERE sub_id = %s "
                        "AND token = %s AND expires_at > %s RETURNING sub_id",
                        (digest, lease.sub_id, lease.token, now)).fetchone()
                else:
                    row = conn.execute(
                        "UPDATE agentd_subscriptions SET digest = coalesce(digest, %s) WHERE sub_id = %s "
                        "AND token = %s AND expires_at > %s RETURNING sub_id",
                        (digest, lease.sub_id, lease.token, now)).fetchone()
                return row is not None

        if not await self.store.db.call(work, "wake record"):
            raise LeaseLost(f"subscription {lease.uri!r}: lease {lease.token} of {self.member!r} was lost; "
                            "the wake was not recorded")

    async def release(self, leases: Sequence[SubLease]) -> None:
        """Hand ``leases`` back for any member to claim at once (a no-op for one that is no longer ours)."""
        if not leases:
            return
        await self.store.db.call(lambda conn: conn.execute(
            "UPDATE agentd_subscriptions SET owner = NULL, token = NULL, expires_at = NULL "
            "WHERE owner = %s AND token = ANY(%s)", (self.member, [lease.token for lease in leases])), "release")

    async def leave(self, leases: Sequence[SubLease]) -> None:
        """Stop taking part: hand ``leases`` back and drop out of the shares."""
        await self.release(leases)
        await self.store.db.call(lambda conn: conn.execute(
            "DELETE FROM agentd_subscribers WHERE scope = %s AND member_id = %s", (self.scope, self.member)), "leave")


def share(total: int, capacity: int, capacity_alive: int) -> int:
    """How many of ``total`` subscriptions a member with ``capacity`` holds at most, when the members taking part
    have ``capacity_alive`` (this member's own counted even when its first heartbeat is not in yet)."""
    if total <= 0 or capacity <= 0:
        return 0
    return math.ceil(total * capacity / max(capacity_alive, capacity))


@attrs.define(eq=False)
class _Held:
    lease: SubLease
    #: trio time until which the lease is surely live (its last renewal plus the TTL).
    deadline: float


@attrs.define(eq=False)
class ClusterReactive:
    """:class:`agentd.reactive.shared.Shared` for a cluster member: owns subscriptions under leases (watching
    exactly what it holds) and enqueues self-scheduled runs."""

    subs: Subscriptions
    log: EventLog
    ttl: float
    #: Extra payload of an enqueued self-scheduled run (the daemon's output contract).
    payload: Mapping[str, Any] = attrs.field(factory=dict)
    _declared: dict[str, str | None] = attrs.field(factory=dict, init=False)  # uri -> server
    _declared_saved: bool = attrs.field(default=True, init=False)
    _held: dict[str, _Held] = attrs.field(factory=dict, init=False)  # uri -> lease
    _lost: set[str] = attrs.field(factory=set, init=False)
    _share: int = attrs.field(default=0, init=False)
    _kick: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def held(self) -> list[str]:
        return sorted(self._held)

    async def declare(self, subscriptions: Sequence[tuple[str | None, str]]) -> None:
        self._declared = {uri: server for server, uri in subscriptions}
        self._declared_saved = False
        await self._save_declared()
        self._kick.set()

    async def _save_declared(self) -> None:
        if self._declared_saved:
            return
        try:
            await self.subs.add([(server, uri) for uri, server in self._declared.items()], "config")
        except JournalError as exc:  # retried at the next tick
            self.log.warn("cluster.heartbeat_failed", error=str(exc))
            return
        self._declared_saved = True

    async def subscribe(self, uri: str) -> None:
        await self.subs.add([(None, uri)], "self")
        self._kick.set()

    async def unsubscribe(self, uri: str) -> bool:
        removed = await self.subs.remove(uri)
        if removed and uri in self._held:
            self._lost.add(uri)
            self._kick.set()
        return removed

    async def schedule(self, after: float, instruction: str) -> bool:
        store, key = self.subs.store, f"scheduled.{uuid.uuid4().hex}"
        payload = {**self.payload, "instruction": instruction}

        def work(conn: Conn) -> bool:
            with conn.transaction():
                now = store.now_in(conn)
                return enqueue_in(conn, key, "schedule", payload, now, now + after)

        try:
            created = await store.db.call(work, "enqueue")
        except JournalError as exc:
            self.log.warn("schedule.fire", after_s=after, applied=False, reason=str(exc))
            return False
        self.log.info("trigger.armed", trigger="scheduled", after_s=after, cluster=key)
        return created

    async def record(self, uri: str, contents: Sequence[Mapping[str, Any]] | None) -> bool:
        held = self._held.get(uri)
        if held is None or uri in self._lost:
            self.log.warn("cluster.subscription_fenced", uri=uri, token=None, reason="not held by this member")
            return False
        digest, attempt = digest_of(contents), 0
        while True:
            try:
                await self.subs.record(held.lease, digest)
                return True
            except LeaseLost as exc:
                self.log.warn("cluster.subscription_fenced", uri=uri, token=held.lease.token, reason=str(exc))
                self._lose(uri)
                return False
            except ClusterUnavailable:
                # Retried while the lease surely holds; past that, whoever owns it next compares with the digest
                # recorded last and wakes for this change.
                attempt += 1
                wait = exponential(attempt, RETRY_BASE, RETRY_CAP)
                if trio.current_time() + wait >= held.deadline:
                    self.log.warn("cluster.subscription_fenced", uri=uri, token=held.lease.token,
                                  reason="the cluster database is unreachable for longer than the lease")
                    self._lose(uri)
                    return False
                await trio.sleep(wait)
            except JournalError as exc:
                self.log.warn("cluster.subscription_fenced", uri=uri, token=held.lease.token, reason=str(exc))
                return False

    def _lose(self, uri: str) -> None:
        if uri in self._held:
            self._lost.add(uri)
            self._kick.set()

    # --- the owner loop ---

    async def serve(self, watcher: Watcher, notify: Notify, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat)
                task_status.started()
                await self._own(watcher)
        finally:
            with trio.move_on_after(RELEASE_GRACE, shield=True):
                leases = [held.lease for held in self._held.values()]
                try:
                    await self.subs.leave(leases)
                except JournalError:
                    pass  # they expire after the TTL
                for lease in leases:
                    self.log.info("cluster.subscription_released", uri=lease.uri, token=lease.token,
                                  reason="stopping")

    async def _heartbeat(self) -> None:
        failures = 0
        while True:
            held = dict(self._held)
            started = trio.current_time()
            try:
                kept, self._share = await self.subs.heartbeat([h.lease.token for h in held.values()], self.ttl)
            except JournalError as exc:
                failures += 1
                if not isinstance(exc, ClusterUnavailable):
                    self.log.warn("cluster.heartbeat_failed", error=str(exc))
                await trio.sleep(exponential(failures, RETRY_BASE, RETRY_CAP))
                continue
            failures = 0
            for uri, entry in held.items():
                if self._held.get(uri) is not entry:
                    continue
                if entry.lease.token in kept:
                    entry.deadline = started + self.ttl
                else:
                    self.log.warn("cluster.subscription_lost", uri=uri, token=entry.lease.token)
                    self._lose(uri)
            self._kick.set()
            await trio.sleep(self.ttl / 3)

    async def _own(self, watcher: Watcher) -> None:
        failures = 0
        while True:
            self._kick = trio.Event()
            try:
                await self._tick(watcher)
            except JournalError as exc:
                failures += 1
                if not isinstance(exc, ClusterUnavailable):
                    self.log.warn("cluster.claim_failed", error=str(exc))
                await trio.sleep(exponential(failures, RETRY_BASE, RETRY_CAP))
                continue
            failures = 0
            with trio.move_on_after(self.ttl / 3):
                await self._kick.wait()

    async def _tick(self, watcher: Watcher) -> None:
        # Lost ones first: stop watching (so a wake of this member no longer starts), then forget them.
        for uri in sorted(self._lost):
            entry = self._held.pop(uri, None)
            if entry is not None:
                await watcher.unwatch(uri, _ORIGINS[entry.lease.origin])
        self._lost.clear()
        await self._save_declared()
        # Declared ones no longer declared (a reload dropped them), and any beyond the share, go back.
        surplus = [h for uri, h in self._held.items() if h.lease.origin == "config" and uri not in self._declared]
        beyond = len(self._held) - len(surplus) - self._share
        if beyond > 0:
            rest = [h for h in self._held.values() if h not in surplus]
            surplus += rest[-beyond:]
        if surplus:
            for entry in surplus:
                self._held.pop(entry.lease.uri, None)
                await watcher.unwatch(entry.lease.uri, _ORIGINS[entry.lease.origin])
            await self.subs.release([h.lease for h in surplus])
            for entry in surplus:
                self.log.info("cluster.subscription_released", uri=entry.lease.uri, token=entry.lease.token,
                              reason="share" if entry.lease.uri in self._declared or entry.lease.origin == "self"
                              else "no longer declared")
        room = self._share - len(self._held)
        if room <= 0:
            return
        taken = await self.subs.claim(room, list(self._declared), self.ttl)
        for lease in taken:
            await self._take(watcher, lease)

    async def _take(self, watcher: Watcher, lease: SubLease) -> None:
        """Subscribe as the new owner and read after subscribing: a change since the last recorded wake is one."""
        entry = _Held(lease, trio.current_time() + self.ttl)
        self._held[lease.uri] = entry
        server = self._declared.get(lease.uri, lease.server) if lease.origin == "config" else lease.server
        try:
            with trio.fail_after(self.ttl / 2):
                after = await watcher.watch(lease.uri, _ORIGINS[lease.origin], server, since=lease.digest)
        except Exception as exc:  # the server is down, say: hand it back, to be tried again
            self._held.pop(lease.uri, None)
            self.log.warn("mcp.subscribe", uri=lease.uri, action="subscribe", origin=lease.origin, applied=False,
                          error=type(exc).__name__, reason=str(exc))
            await self.subs.release([lease])
            return
        self.log.info("cluster.subscription_owned", uri=lease.uri, token=lease.token, origin=lease.origin,
                      missed=after is not None and lease.digest is not None and after != lease.digest)
        if lease.digest is None and after is not None:
            try:  # the first owner: what a later owner compares with
                await self.subs.record(lease, after, wake=False)
            except LeaseLost:
                self._lose(lease.uri)
