"""A daemon as a cluster member: register, heartbeat and renew leases, claim work within capacity, run it.

Why one task tree: the member owns three loops in one nursery, each with bounded waits:

- the heartbeat (every ``ttl / 3``) marks the member alive and renews the leases of what it runs; a run
  whose lease was LOST (another member took it after this one was paused or partitioned) is cancelled at
  once, and its commits would be refused anyway (fencing, agentd.cluster.store.FencedJournal). On the same
  cadence it reads the capacity signal (agentd.cluster.capacity: one bounded statement) into the member's
  :class:`~agentd.cluster.capacity.CapacityBoard` and the metrics, so scrapes never touch the database;
- the listener holds ``LISTEN agentd_work`` and ``LISTEN agentd_done`` on its own connection and worker
  thread, waking the claimer when work is enqueued and the waiters of an item when it ends
  (agentd.cluster.watch); it returns to trio at least every :data:`LISTEN_SLICE` seconds, so cancelling it
  takes at most that long;
- the claimer claims up to the free capacity (``FOR UPDATE SKIP LOCKED``, agentd.cluster.work), starts each
  item in the member's nursery, and otherwise waits for a wake-up or :data:`POLL_INTERVAL`.

Losing the database: a failed claim or heartbeat is logged (``cluster.unavailable``) and retried with
agentd.backoff; nothing new is claimed meanwhile; running work keeps running (its commits wait, see
FencedJournal) and everything resumes when the database answers again (``cluster.available``).

What runs an item is the caller's :data:`Execute` (the daemon runs a run through agentd.run with the
fenced journal, so a re-claimed item resumes from its journal).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import psycopg
import trio

from agentd import defaults
from agentd.backoff import exponential
from agentd.cluster.capacity import CapacityBoard, read_capacity
from agentd.cluster.db import Database
from agentd.cluster.errors import ClusterUnavailable, LeaseLost
from agentd.cluster.store import FencedJournal
from agentd.cluster.watch import FALLBACK_POLL, DoneWatch
from agentd.cluster.work import CANCELLED, DONE_CHANNEL, WORK_CHANNEL, Queue, WorkItem
from agentd.errors import flatten, leaves
from agentd.journal.errors import JournalError
from agentd.journal.records import RunEnded
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog

#: Longest the claimer waits without a wake-up before looking again (a lost NOTIFY, expired leases).
POLL_INTERVAL: Final = 1.0
#: Longest one listening call stays on its worker thread (bounds how long cancelling the listener takes).
LISTEN_SLICE: Final = 0.5
#: Bound on handing an unfinished item back when its run stops here.
RELEASE_GRACE: Final = 2.0
#: Backoff while the database is unreachable: base and cap in seconds.
RETRY_BASE: Final = 0.2
RETRY_CAP: Final = 5.0

#: Runs one claimed item with its fenced journal; returns when the run ended (its RunEnded committed).
Execute = Callable[[WorkItem, FencedJournal], Awaitable[Any]]


@attrs.define(eq=False)
class Member:
    queue: Queue
    execute: Execute
    log: EventLog
    ttl: float = defaults.CLUSTER_LEASE_TTL
    listen_db: Database | None = None
    #: Waiters for items' ends (the served cluster handles), woken by ``NOTIFY agentd_done``.
    watch: DoneWatch | None = None
    #: Where the member publishes its slots and the last capacity read (``agentd ctl status``).
    board: CapacityBoard | None = None
    _running: dict[str, tuple[WorkItem, trio.CancelScope]] = attrs.field(factory=dict)
    _cancelling: set[str] = attrs.field(factory=set)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    #: The database was found unreachable (by any part) and has not answered since.
    _down: bool = False

    @property
    def running(self) -> int:
        return len(self._running)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.queue.register()
        self.log.info("cluster.joined", member=self.queue.member, address=self.queue.address,
                      capacity=self.queue.capacity, lease_ttl=self.ttl, database=self.queue.db.where)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat)
                if self.listen_db is not None:
                    nursery.start_soon(self._listen, self.listen_db)
                if self.watch is not None:
                    nursery.start_soon(self._look_at_watched, self.watch)
                task_status.started()
                await self._claim_loop(nursery)
        finally:
            with trio.move_on_after(2, shield=True):
                try:
                    await self.queue.leave()
                except JournalError:
                    pass

    def _unavailable(self, exc: ClusterUnavailable, attempt: int) -> None:
        # Once per outage for the member, whichever part noticed (heartbeat, claimer, a running item's commit);
        # the next answer to any of the loops ends it (the heartbeat always runs, so one comes).
        if not self._down:
            self._down = True
            self.log.warn("cluster.unavailable", error=str(exc))

    def _available(self) -> None:
        if self._down:
            self._down = False
            self.log.info("cluster.available", database=self.queue.db.where)

    def _slots_changed(self) -> None:
        if self.board is not None:
            self.board.running = len(self._running)

    async def _read_capacity(self) -> None:
        """The capacity signal, on the heartbeat's cadence (a failed read keeps the last one: it says its age)."""
        try:
            signal = await read_capacity(self.queue.store, self.ttl)
        except JournalError:
            return
        if self.board is not None:
            self.board.last, self.board.read_at = signal, trio.current_time()
        metrics.cluster_capacity(max(0, self.queue.capacity - len(self._running)), len(signal.members),
                                 signal.free_slots, signal.queued, signal.oldest_queued_age)

    async def _heartbeat(self) -> None:
        failures = 0
        while True:
            if not failures:  # after the renewals and their consequences, never ahead of them
                await self._read_capacity()
            await trio.sleep(self.ttl / 3 if not failures else exponential(failures, RETRY_BASE, RETRY_CAP))
            leases = [item.lease for item, _ in self._running.values()]
            try:
                lost = await self.queue.heartbeat(leases, self.ttl)
            except ClusterUnavailable as exc:
                failures += 1
                self._unavailable(exc, failures)
                continue
            except JournalError as exc:
                self.log.warn("cluster.heartbeat_failed", error=str(exc))
                continue
            self._available()
            failures = 0
            for run_id in lost:
                entry = self._running.get(run_id)
                if entry is not None:
                    self.log.warn("cluster.lease_lost", work=run_id, token=entry[0].lease.token)
                    entry[1].cancel()
            try:
                cancels = await self.queue.cancel_requested([item.work_id for item, _ in self._running.values()])
            except JournalError:
                continue
            for run_id in cancels - lost:
                entry = self._running.get(run_id)
                if entry is not None and run_id not in self._cancelling:
                    self.log.info("cluster.cancel", work=run_id)
                    self._cancelling.add(run_id)
                    entry[1].cancel()

    async def _listen(self, db: Database) -> None:
        failures = 0
        while True:
            try:
                heard = await db.call(_listen_once, "listen")
            except JournalError:
                failures += 1
                await trio.sleep(exponential(failures, RETRY_BASE, RETRY_CAP))
                continue
            if failures and self.watch is not None:
                self.watch.recheck()  # listening again: what ended meanwhile was not heard
            failures = 0
            for channel, payload in heard:
                if channel == WORK_CHANNEL:
                    self._wake.set()
                elif self.watch is not None:
                    self.watch.done(payload)

    async def _look_at_watched(self, watch: DoneWatch) -> None:
        """Every FALLBACK_POLL, one read of every watched item's state: an end whose notification was lost
        reaches its waiters by then (a failed read is tried again at the next look)."""
        while True:
            await trio.sleep(FALLBACK_POLL)
            watched = watch.watched()
            try:
                ended = await self.queue.finished(watched)
            except JournalError:
                continue
            for work_id in ended:
                watch.done(work_id)

    async def _claim_loop(self, nursery: trio.Nursery) -> None:
        failures = 0
        while True:
            self._wake = trio.Event()  # a wake-up from now on (a NOTIFY during the claim) ends the next wait
            free = self.queue.capacity - len(self._running)
            claimed: list[WorkItem] = []
            if free > 0:
                try:
                    claimed = await self.queue.claim(free, self.ttl)
                except ClusterUnavailable as exc:
                    failures += 1
                    self._unavailable(exc, failures)
                    await trio.sleep(exponential(failures, RETRY_BASE, RETRY_CAP))
                    continue
                except JournalError as exc:
                    self.log.warn("cluster.claim_failed", error=str(exc))
                self._available()
                failures = 0
            for item in claimed:
                scope = trio.CancelScope()
                self._running[item.work_id] = (item, scope)
                self._slots_changed()
                self.log.info("cluster.claimed", work=item.work_id, kind=item.kind, token=item.lease.token,
                              attempt=item.attempt)
                nursery.start_soon(self._run, item, scope)
            if claimed and len(claimed) == free:
                continue  # maybe more: claim again at once while capacity remains
            with trio.move_on_after(POLL_INTERVAL):
                await self._wake.wait()

    async def _run(self, item: WorkItem, scope: trio.CancelScope) -> None:
        journal = FencedJournal(self.queue.store, item.lease, on_unavailable=self._unavailable)
        finished = False
        try:
            with scope:
                await self.execute(item, journal)
                await self._finish(item)
                finished = True
            if not finished and item.work_id in self._cancelling:  # a peer cancelled it: end it, fenced
                await journal.append(item.work_id, [CANCELLED])
                await self._finish(item)
                finished = True
        except Exception as exc:  # a bad item (its payload, its run id) never takes the member down
            # Whatever escapes the run comes wrapped in its nurseries' exception groups: a lost lease anywhere
            # in it is fencing (the item goes on with its new owner), not a failure of the item.
            lost = next((e for e in leaves(exc) if isinstance(e, LeaseLost)), None)
            found = flatten(exc)
            if lost is not None:
                self.log.warn("cluster.fenced", work=item.work_id, token=item.lease.token, owner=lost.new_owner,
                              new_token=lost.new_token, error=str(lost))
            elif isinstance(found, JournalError):
                self.log.error("cluster.work_failed", work=item.work_id, error=str(found))
            else:
                error = f"{type(found).__name__}: {found}"[:500]
                self.log.error("cluster.work_failed", work=item.work_id, error=error)
                finished = await self._fail(item, journal, error)
        finally:
            self._running.pop(item.work_id, None)
            self._slots_changed()
            self._cancelling.discard(item.work_id)
            self._wake.set()
            if not finished:
                # Stopped here (drained, cancelled, failed): hand the item back at once instead of after the
                # lease's TTL. A no-op when the lease is no longer ours.
                with trio.move_on_after(RELEASE_GRACE, shield=True):
                    try:
                        await self.queue.store.release(item.lease)
                    except JournalError:
                        pass

    async def _fail(self, item: WorkItem, journal: FencedJournal, error: str) -> bool:
        """End an item that cannot run with a failed ``run.ended`` (so it is not claimed forever)."""
        try:
            await journal.append(item.work_id, [RunEnded("failed", None, error)], durable=True)
            await self._finish(item)
        except JournalError:
            return False
        return True

    async def _finish(self, item: WorkItem) -> None:
        attempt = 0
        while True:
            try:
                await self.queue.finish(item.lease)
                self.log.info("cluster.finished", work=item.work_id, token=item.lease.token)
                return
            except ClusterUnavailable as exc:
                attempt += 1
                self._unavailable(exc, attempt)
                await trio.sleep(exponential(attempt, RETRY_BASE, RETRY_CAP))


#: Most notifications one listening call hands back (the rest wait for the next call).
LISTEN_BATCH: Final = 256


def _listen_once(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """On the listener's worker thread: LISTEN (idempotent) and wait at most LISTEN_SLICE for notifications;
    ``(channel, payload)`` of those heard (the first one ends the wait; any that came with it are kept)."""
    conn.execute(f"LISTEN {WORK_CHANNEL}; LISTEN {DONE_CHANNEL}")
    heard: list[tuple[str, str]] = []
    for notify in conn.notifies(timeout=LISTEN_SLICE, stop_after=1):
        heard.append((notify.channel, notify.payload))
        if len(heard) >= LISTEN_BATCH:
            break
    return heard
