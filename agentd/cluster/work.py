"""Members and work items: who is in the cluster, and which member runs what.

Why rows: a served async spawn or a scheduled fire is a row in ``agentd_work`` that any member may claim
within its capacity, so work survives the member that accepted it. The rules, each one transaction:

- :func:`enqueue` inserts an item under a caller-chosen unique key (``ON CONFLICT DO NOTHING``): a scheduled
  occurrence keyed by its schedule and time is enqueued by every member and exists once, so it fires once.
  One statement (:data:`ENQUEUE_SQL`), its NOTIFY included.
- :meth:`Queue.claim` picks open items whose lease is free or expired with ``FOR UPDATE SKIP LOCKED`` (two
  members never wait on, or take, the same row), takes each one's lease with a new fencing token (the
  conditional upsert of :func:`agentd.cluster.store.claim_in`), and appends ``claim.taken`` to the item's
  run journal, all in the SAME transaction: a claim is in the journal exactly when it happened. However many
  items it takes, a claim is two statements (:data:`CLAIM_SQL`, :data:`CLAIMED_SQL`) in one transaction.
  Under concurrent claims one may take fewer items than it asked for: a row another member committed first is
  passed over (never taken twice), and the member claims again at its next wake.
- :meth:`Queue.heartbeat` records the member as alive and renews the leases of what it runs; a lease that
  is not renewed (the member died, or was partitioned longer than the TTL) expires and the next claim
  takes the item, whose run resumes from its journal on the new owner.
- :meth:`Queue.finish` marks an item done, fenced: an owner that lost its lease finishes nothing. One
  statement (:data:`FINISH_SQL`) whose fence is the lease row itself: it deletes the row only while it
  carries the caller's token, and marks done only the items whose row it deleted. Finishes that arrive
  while one is being committed are committed together, in one statement and one WAL flush
  (agentd.journal.group), each with its own outcome.

Durability: claims and finishes are synchronous commits (the session's ``synchronous_commit = on``,
agentd.cluster.db): a member acts on them (runs the item, tells the waiters it ended).

Wake-ups: :func:`enqueue` and :meth:`Queue.finish` send ``NOTIFY`` on :data:`WORK_CHANNEL` /
:data:`DONE_CHANNEL`, so idle members claim at once instead of at their next poll.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import psycopg

from agentd.cluster.db import Database
from agentd.cluster.store import DEADLOCK_RETRIES, PgJournal, append_in, lost_lease
from agentd.journal.group import GroupCommit, Pending
from agentd.journal.records import ClaimTaken, RunEnded, encode
from agentd.journal.store import Lease

#: Channels of the wake-up notifications.
WORK_CHANNEL: Final = "agentd_work"
DONE_CHANNEL: Final = "agentd_done"

Conn = psycopg.Connection[Any]

#: The database's clock (lease times), or the store's ``lease_clock`` when one is set (tests): ``%(now)s``.
_NOW = "COALESCE(%(now)s::float8, extract(epoch from clock_timestamp())::float8)"

#: Take up to ``%(n)s`` claimable items for ``%(owner)s``: the candidates (oldest first, rows another member
#: holds skipped), each one's lease (the conditional upsert of agentd.cluster.store.claim_in: a live lease of
#: another owner is left alone) and the item's owner, token and attempt; the claimed items, oldest first.
CLAIM_SQL: Final = f"""
WITH clock AS (SELECT {_NOW} AS now),
candidates AS (
    SELECT w.work_id, w.created_at FROM agentd_work w LEFT JOIN agentd_leases l ON l.run_id = w.work_id, clock
    WHERE w.status = 'open' AND w.not_before <= clock.now AND (l.run_id IS NULL OR l.expires_at <= clock.now)
    ORDER BY w.created_at, w.work_id LIMIT %(n)s FOR UPDATE OF w SKIP LOCKED),
leased AS (
    INSERT INTO agentd_leases AS l (run_id, owner, token, expires_at)
    SELECT c.work_id, %(owner)s, nextval('agentd_fence'), clock.now + %(ttl)s FROM candidates c, clock
    ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = excluded.token,
        expires_at = excluded.expires_at
    WHERE l.expires_at <= (SELECT now FROM clock) OR l.owner = excluded.owner
    RETURNING run_id, token, expires_at),
taken AS (
    UPDATE agentd_work w SET owner = %(owner)s, token = leased.token, attempts = w.attempts + 1,
        claimed_at = (SELECT now FROM clock)
    FROM leased WHERE w.work_id = leased.run_id
    RETURNING w.work_id, w.kind, w.payload, w.attempts, w.created_at, leased.token, leased.expires_at)
SELECT work_id, kind, payload, attempts, token, expires_at FROM taken ORDER BY created_at, work_id
"""

#: Append one record (``claim.taken``) to each claimed item's run journal: ``%(runs)s`` and ``%(bodies)s`` are
#: parallel arrays (one record each), ``%(ts)s`` the records' time (as agentd.cluster.store.append_in).
CLAIMED_SQL: Final = """
WITH seq AS (
    INSERT INTO agentd_runs AS r (run_id, status, started_at, parent, next_seq)
    SELECT run_id, 'running', %(ts)s, NULL, 1 FROM unnest(%(runs)s::text[]) AS u(run_id)
    ON CONFLICT (run_id) DO UPDATE SET next_seq = r.next_seq + 1
    RETURNING run_id, next_seq - 1 AS seq)
INSERT INTO agentd_entries (run_id, seq, ts, kind, body)
SELECT seq.run_id, seq.seq, %(ts)s, %(kind)s, b.body
FROM seq JOIN unnest(%(runs)s::text[], %(bodies)s::text[]) AS b(run_id, body) ON b.run_id = seq.run_id
"""

#: Finish the items of ``%(runs)s`` / ``%(tokens)s`` (parallel arrays), fenced: a lease row is deleted only while
#: it carries the token, an item is marked done only if its lease row was deleted (its ``agentd_done`` NOTIFY
#: sent); the items finished. Under a concurrent claim, the row lock orders the two: a claim that re-leased
#: the row first leaves the token changed (nothing deleted, nothing done).
FINISH_SQL: Final = f"""
WITH mine AS (SELECT * FROM unnest(%(runs)s::text[], %(tokens)s::bigint[]) AS m(run_id, token)),
freed AS (
    DELETE FROM agentd_leases l USING mine WHERE l.run_id = mine.run_id AND l.token = mine.token
    RETURNING l.run_id),
done AS (
    UPDATE agentd_work SET status = 'done', finished_at = {_NOW.replace("%(now)s", "NULL")}
    WHERE work_id IN (SELECT run_id FROM freed) RETURNING work_id)
SELECT work_id, pg_notify(%(channel)s, work_id) FROM done
"""


@attrs.frozen
class WorkItem:
    """A claimed item: its id (also its run id), kind, JSON payload, attempt number and the lease to fence with."""

    work_id: str
    kind: str
    payload: Mapping[str, Any]
    attempt: int
    lease: Lease


@attrs.frozen
class WorkView:
    """An item as any member sees it (for ``subagent.status`` on a handle and ``agentd cluster status``)."""

    work_id: str
    kind: str
    status: str  # open | done
    owner: str | None
    attempts: int
    created_at: float
    finished_at: float | None


#: Insert an item unless its key exists and, if inserted, NOTIFY the claimers: one statement. ``%(now)s`` as in
#: :data:`_NOW` (None: the database's clock); ``%(not_before)s`` None: at once.
ENQUEUE_SQL: Final = f"""
WITH clock AS (SELECT {_NOW} AS now),
added AS (
    INSERT INTO agentd_work (work_id, kind, payload, created_at, not_before)
    SELECT %(id)s, %(kind)s, %(payload)s, clock.now, COALESCE(%(not_before)s::float8, clock.now) FROM clock
    ON CONFLICT (work_id) DO NOTHING RETURNING work_id)
SELECT work_id, pg_notify(%(channel)s, work_id) FROM added
"""


def enqueue_in(conn: Conn, work_id: str, kind: str, payload: Mapping[str, Any], now: float | None,
               not_before: float | None = None) -> bool:
    """Add an item (one statement: atomic on its own, or part of the caller's transaction); ``now`` None is the
    database's clock. False when the key exists (nothing changed)."""
    row = conn.execute(ENQUEUE_SQL, {"now": now, "id": work_id, "kind": kind, "not_before": not_before,
                                     "payload": json.dumps(payload, separators=(",", ":")),
                                     "channel": WORK_CHANNEL}).fetchone()
    return row is not None


async def enqueue(store: PgJournal, work_id: str, kind: str, payload: Mapping[str, Any], *,
                  not_before: float | None = None) -> bool:
    """Add an item under the unique ``work_id``; False when it already exists (nothing changed)."""
    now = store.lease_clock() if store.lease_clock is not None else None
    return await store.db.call(lambda conn: enqueue_in(conn, work_id, kind, payload, now, not_before), "enqueue")


#: The ``run.ended`` of an item cancelled by a peer (the shape a run's recorded result has).
CANCELLED = RunEnded("cancelled", {"status": "cancelled", "done": True, "result": None}, "cancelled by peer")


async def request_cancel(store: PgJournal, work_id: str) -> bool:
    """Ask for an item's cancel; False when there is no such open item. An item nobody runs (no live lease)
    ends ``cancelled`` here and now; a running one is cancelled by its owner at its next heartbeat, which
    then commits the same ``run.ended`` (fenced)."""

    def work(conn: Conn) -> bool:
        with conn.transaction():
            _ = conn.execute("SET LOCAL synchronous_commit = on")
            row = conn.execute("SELECT status FROM agentd_work WHERE work_id = %s FOR UPDATE", (work_id,)).fetchone()
            if row is None or row[0] != "open":
                return False
            conn.execute("UPDATE agentd_work SET cancel_requested = true WHERE work_id = %s", (work_id,))
            now = store.now_in(conn)
            live = conn.execute("SELECT 1 FROM agentd_leases WHERE run_id = %s AND expires_at > %s FOR UPDATE",
                                (work_id, now)).fetchone()
            if live is None:
                append_in(conn, work_id, [CANCELLED], store.clock())
                conn.execute("UPDATE agentd_work SET status = 'done', finished_at = %s WHERE work_id = %s",
                             (now, work_id))
                conn.execute("DELETE FROM agentd_leases WHERE run_id = %s", (work_id,))
                conn.execute("SELECT pg_notify(%s, %s)", (DONE_CHANNEL, work_id))
            return True

    return await store.db.call(work, "cancel")


async def view(store: PgJournal, work_id: str) -> WorkView | None:
    row = await store.db.call(lambda conn: conn.execute(
        "SELECT w.work_id, w.kind, w.status, l.owner, w.attempts, w.created_at, w.finished_at FROM agentd_work w "
        "LEFT JOIN agentd_leases l ON l.run_id = w.work_id WHERE w.work_id = %s", (work_id,)).fetchone(), "read")
    return None if row is None else WorkView(*row)


@attrs.define(eq=False)
class Queue:
    """One member's side of the work queue (its id, address and capacity)."""

    store: PgJournal
    member: str
    address: str | None
    capacity: int
    #: Every finish goes through it (group commit; its counts are the tests' view of the grouping).
    finisher: GroupCommit[Lease, None] = attrs.field(init=False)

    @finisher.default
    def _finishes(self) -> GroupCommit[Lease, None]:
        return GroupCommit(self._finish_group)

    @property
    def db(self) -> Database:
        return self.store.db

    async def register(self) -> None:
        def work(conn: Conn) -> None:
            now = self.store.now_in(conn)
            conn.execute(
                "INSERT INTO agentd_members (member_id, address, capacity, started_at, heartbeat_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (member_id) DO UPDATE SET address = excluded.address, "
                "capacity = excluded.capacity, started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at",
                (self.member, self.address, self.capacity, now, now))

        await self.db.call(work, "register")

    async def leave(self) -> None:
        await self.db.call(lambda conn: conn.execute("DELETE FROM agentd_members WHERE member_id = %s",
                                                     (self.member,)), "leave")

    async def heartbeat(self, leases: Sequence[Lease], ttl: float) -> set[str]:
        """Mark this member alive and renew ``leases``; return the run ids whose lease is LOST."""
        tokens = [lease.token for lease in leases]

        def work(conn: Conn) -> set[str]:
            with conn.transaction():
                now = self.store.now_in(conn)
                conn.execute("UPDATE agentd_members SET heartbeat_at = %s WHERE member_id = %s", (now, self.member))
                kept = {r[0] for r in conn.execute(
                    "UPDATE agentd_leases SET expires_at = %s WHERE owner = %s AND token = ANY(%s) RETURNING run_id",
                    (now + ttl, self.member, tokens))}
            return {lease.run_id for lease in leases} - kept

        return await self.db.call(work, "heartbeat")

    async def cancel_requested(self, work_ids: Sequence[str]) -> set[str]:
        """Which of ``work_ids`` a peer asked to cancel."""
        if not work_ids:
            return set()
        rows = await self.db.call(lambda conn: conn.execute(
            "SELECT work_id FROM agentd_work WHERE work_id = ANY(%s) AND cancel_requested", (list(work_ids),)
        ).fetchall(), "read")
        return {r[0] for r in rows}

    async def finished(self, work_ids: Sequence[str]) -> set[str]:
        """Which of ``work_ids`` are done (one read, however many)."""
        if not work_ids:
            return set()
        rows = await self.db.call(lambda conn: conn.execute(
            "SELECT work_id FROM agentd_work WHERE work_id = ANY(%s) AND status = 'done'", (list(work_ids),)
        ).fetchall(), "read")
        return {r[0] for r in rows}

    async def claim(self, limit: int, ttl: float) -> list[WorkItem]:
        """Claim up to ``limit`` open items whose lease is free or expired (see the module docstring)."""
        if limit <= 0:
            return []

        def work(conn: Conn) -> list[WorkItem]:
            now = self.store.lease_clock() if self.store.lease_clock is not None else None
            with conn.transaction():
                rows = conn.execute(CLAIM_SQL, {"now": now, "n": limit, "owner": self.member, "ttl": ttl}).fetchall()
                claimed = [WorkItem(work_id, kind, json.loads(payload), int(attempt),
                                    Lease(work_id, self.member, int(token), float(expires)))
                           for work_id, kind, payload, attempt, token, expires in rows]
                if claimed:
                    bodies = [json.dumps(encode(ClaimTaken(self.member, item.lease.token, item.attempt)),
                                         ensure_ascii=False, separators=(",", ":")) for item in claimed]
                    conn.execute(CLAIMED_SQL, {"ts": self.store.clock(), "kind": ClaimTaken.KIND, "bodies": bodies,
                                               "runs": [item.work_id for item in claimed]})
            return claimed

        return await self.db.call(work, "claim")

    async def finish(self, lease: Lease) -> None:
        """Mark the item done and free its lease, fenced (LeaseLost: nothing changed). Concurrent finishes of
        this member share one statement (see the module docstring)."""
        await self.finisher.submit(lease)

    async def _finish_group(self, group: Sequence[Pending[Lease, None]]) -> None:
        leases = [p.batch for p in group]

        def work(conn: Conn) -> tuple[set[str], dict[str, Any]]:
            params = {"runs": [lease.run_id for lease in leases], "tokens": [lease.token for lease in leases],
                      "channel": DONE_CHANNEL}
            for attempt in range(DEADLOCK_RETRIES + 1):  # a claim racing an expired lease's finish
                try:
                    done = {r[0] for r in conn.execute(FINISH_SQL, params)}
                    break
                except psycopg.errors.DeadlockDetected:
                    if attempt == DEADLOCK_RETRIES:
                        raise
            refused = [lease.run_id for lease in leases if lease.run_id not in done]
            holders = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT run_id, owner, token FROM agentd_leases WHERE run_id = ANY(%s)", (refused,))} if refused else {}
            return done, holders

        done, holders = await self.db.call(work, "finish")
        for pending in group:
            lease = pending.batch
            if lease.run_id in done:
                pending.settle(None)
            else:
                pending.settle(error=lost_lease(lease, holders.get(lease.run_id)))
