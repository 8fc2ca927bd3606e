"""The owner loop of the cluster's subscriptions: :class:`agentd.modes.shared.Shared` for a member.

Why here: it drives the reactive watcher (subscribe what this member holds, unsubscribe what it loses) with the
lease rows of agentd.cluster.subscriptions, so it sits above both. Only a daemon started with ``--cluster``
imports it (agentd.daemon), so the database driver stays off every other path.

- Two tasks: the heartbeat (every ``ttl / 3``) renews the leases and learns the member's share; the owner
  releases what was lost or is beyond the share, then claims up to the share.
- Taking a subscription: subscribe, then read after subscribing (agentd.modes.watch.Watcher.watch with
  ``since``, the digest the last wake recorded): contents that differ are one wake, so a change made while
  nobody owned the subscription is processed once, at least. Failover time is the lease TTL (the dead owner's
  lease expiring) plus one claim tick (``ttl / 3``) plus the subscribe and read.
- A wake is recorded (fenced) before its run starts (:meth:`ClusterReactive.record`); refused, it does not run.
- MCP event subscriptions (``--on-event``) are rows too, keyed ``event:SERVER/NAME``: the member holding one
  delivers it (agentd.modes.events, attached with :meth:`ClusterReactive.attach_events`) from the cursor
  recorded in the row's ``digest`` (JSON; none recorded: from now). A wake records the cursor after its
  occurrences (fenced) before its run starts, a quiet stretch advances it; the next owner resumes from there.
- Self-scheduled runs: :meth:`ClusterReactive.schedule` enqueues a ``schedule`` work item due ``after`` seconds
  from now on the database's clock (agentd.cluster.work), so the run fires once in the cluster on whichever
  member claims it, as a cron occurrence does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import psycopg
import trio

from agentd.backoff import exponential
from agentd.cluster.errors import ClusterUnavailable, LeaseLost
from agentd.cluster.member import RELEASE_GRACE, RETRY_BASE, RETRY_CAP
from agentd.cluster.subscriptions import SubLease, Subscriptions
from agentd.cluster.work import enqueue_in
from agentd.journal.errors import JournalError
from agentd.modes.shared import EventOwner, Notify
from agentd.modes.watch import MISSING, Origin, Watcher, content_digest
from agentd.telemetry.events import EventLog

Conn = psycopg.Connection[Any]

_ORIGINS: Final = {"config": Origin.CONFIG, "self": Origin.SELF}


def digest_of(contents: Sequence[Mapping[str, Any]] | None) -> str:
    return MISSING if contents is None else content_digest(list(contents))


def _cursor_of(digest: str | None) -> str | None:
    """An event subscription's recorded cursor (JSON in the ``digest`` column; nothing recorded: None)."""
    if digest is None:
        return None
    try:
        value = json.loads(digest)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


@attrs.define(eq=False)
class _Held:
    lease: SubLease
    #: trio time until which the lease is surely live (its last renewal plus the TTL).
    deadline: float


@attrs.define(eq=False)
class ClusterReactive:
    """:class:`agentd.modes.shared.Shared` for a cluster member: owns subscriptions under leases (watching
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
    _events: EventOwner | None = attrs.field(default=None, init=False)

    def attach_events(self, owner: EventOwner) -> None:
        self._events = owner

    async def _drop(self, watcher: Watcher, lease: SubLease) -> None:
        """Stop watching (or delivering) what ``lease`` names on this member."""
        if self._events is not None and self._events.owns(lease.uri):
            self._events.stop(lease.uri)
            return
        await watcher.unwatch(lease.uri, _ORIGINS[lease.origin])

    async def record_event(self, key: str, cursor: str | None, *, wake: bool) -> bool:
        held = self._held.get(key)
        if held is None or key in self._lost:
            if wake:
                self.log.warn("cluster.subscription_fenced", uri=key, token=None, reason="not held by this member")
            return False
        try:
            if wake:
                await self.subs.record(held.lease, json.dumps(cursor))
            else:
                await self.subs.advance(held.lease, json.dumps(cursor))
            return True
        except LeaseLost as exc:
            self.log.warn("cluster.subscription_fenced", uri=key, token=held.lease.token, reason=str(exc))
            self._lose(key)
            return False
        except JournalError as exc:  # unreachable now: a wake does not run; a quiet cursor waits for the next
            if wake:
                self.log.warn("cluster.subscription_fenced", uri=key, token=held.lease.token, reason=str(exc))
            return False

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
                await self._drop(watcher, entry.lease)
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
                await self._drop(watcher, entry.lease)
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
        if self._events is not None and self._events.owns(lease.uri):
            cursor = _cursor_of(lease.digest)
            self._events.start(lease.uri, cursor)
            self.log.info("cluster.subscription_owned", uri=lease.uri, token=lease.token, origin=lease.origin,
                          cursor="recorded" if cursor is not None else "now")
            return
        server = self._declared.get(lease.uri, lease.server) if lease.origin == "config" else lease.server
        try:
            with trio.fail_after(self.ttl / 2):
                after = await watcher.watch(lease.uri, _ORIGINS[lease.origin], server, since=lease.digest)
        except Exception as exc:  # the server is down, say: hand it back, to be tried again
            self._held.pop(lease.uri, None)
            if watcher.watching(lease.uri, _ORIGINS[lease.origin]):  # subscribed, then the read after it failed
                await watcher.unwatch(lease.uri, _ORIGINS[lease.origin])
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
