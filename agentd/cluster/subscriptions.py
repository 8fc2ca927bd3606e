"""Subscriptions owned by one member at a time: the rows, leases and fencing (``--cluster``).

Why: every member of a cluster runs the same agent. If each subscribed to each ``--subscribe`` URI, one update
would wake every member. Instead each subscription is a row in ``agentd_subscriptions`` under a lease, as a work
item is (agentd.cluster.work), and only the member holding the lease subscribes on the MCP server and runs its
wakes (the owner loop is agentd.modes.clustered). The rules, each one transaction:

- a row is keyed by the agent (:func:`scope_of`, its instruction) and the URI: ``--subscribe`` rows are inserted
  by every member that declares them (``ON CONFLICT DO NOTHING``) and claimed only by members that declare
  them; the ``subscribe`` self-tool inserts a row any member may claim, ``unsubscribe`` deletes it;
- :meth:`Subscriptions.heartbeat` (every ``ttl / 3``) marks the member as taking part, renews its leases and
  says which it kept: a lease that was taken, deleted, or EXPIRED is lost (an expired lease is lost even when
  nobody took it yet, so its owner subscribes again as a new owner would);
- :meth:`Subscriptions.claim` takes free or expired rows (``FOR UPDATE SKIP LOCKED``) up to the member's share
  (:func:`share`), each with a new fencing token from ``agentd_fence``;
- :meth:`Subscriptions.record` is a wake, fenced: it stores the digest of what the wake read only while the
  lease still carries the caller's token, and a wake whose record is refused does not run. Two members never
  run a wake for the same change: the one that recorded it ran it, and the next owner compares with it.

Lease times are the database's clock (agentd.cluster.store.PgJournal.now_in), as for work items.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg

from agentd.cluster.errors import LeaseLost
from agentd.cluster.store import PgJournal

Conn = psycopg.Connection[Any]


def scope_of(instruction: str) -> str:
    """The agent a subscription belongs to across the cluster: members with the same instruction share it."""
    return hashlib.sha256(instruction.encode()).hexdigest()[:16]


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

    async def advance(self, lease: SubLease, digest: str) -> None:
        """Move the recorded position without a wake (an MCP event subscription's cursor after a quiet stretch),
        fenced like :meth:`record`: :class:`LeaseLost` and nothing written once the lease is not ours."""

        def work(conn: Conn) -> bool:
            with conn.transaction():
                now = self.store.now_in(conn)
                row = conn.execute(
                    "UPDATE agentd_subscriptions SET digest = %s WHERE sub_id = %s AND token = %s AND expires_at > %s "
                    "RETURNING sub_id", (digest, lease.sub_id, lease.token, now)).fetchone()
                return row is not None

        if not await self.store.db.call(work, "cursor record"):
            raise LeaseLost(f"subscription {lease.uri!r}: lease {lease.token} of {self.member!r} was lost; "
                            "the cursor was not recorded")

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
