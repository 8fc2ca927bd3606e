"""The capacity signal for autoscalers: live members, free slots, queue depth and the oldest unclaimed item's age.

Why one statement on the heartbeat's cadence: a scrape (``/metrics``), ``agentd ctl status`` and the OTLP
export read the last :class:`Capacity` a member's heartbeat loop fetched (agentd.cluster.member), so scrapes
cost the database nothing and the database sees one read per member per heartbeat, whatever the scrape
rate. The statement is bounded: the members listed (:data:`MAX_MEMBERS`) and the unclaimed items counted
(:data:`QUEUE_COUNT_LIMIT`, read from the partial index on open items) have a ceiling, so a runaway queue
makes the count saturate, never the query slow. ``agentd cluster status`` runs the same statement once.

"Queued" is an open item nobody holds a live lease on and whose ``not_before`` has come: what a free slot
would claim next. "Running" is an open item under a live lease of a live member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.cluster.store import PgJournal

#: At most this many unclaimed items are counted (``queued`` saturates here) and this many members listed.
QUEUE_COUNT_LIMIT: Final = 100_000
MAX_MEMBERS: Final = 256

_QUERY: Final = """
WITH clock AS (SELECT coalesce(%(now)s::float8, extract(epoch from clock_timestamp())::float8) AS now),
live AS (
    SELECT m.member_id, m.address, m.capacity, m.heartbeat_at FROM agentd_members m, clock
    WHERE m.heartbeat_at > clock.now - %(ttl)s ORDER BY m.member_id LIMIT %(members)s
),
busy AS (
    SELECT l.owner, count(*) AS n FROM agentd_leases l JOIN agentd_work w ON w.work_id = l.run_id, clock
    WHERE l.expires_at > clock.now AND w.status = 'open' GROUP BY l.owner
),
waiting AS (
    SELECT w.created_at FROM agentd_work w LEFT JOIN agentd_leases l ON l.run_id = w.work_id, clock
    WHERE w.status = 'open' AND w.not_before <= clock.now AND (l.run_id IS NULL OR l.expires_at <= clock.now)
    ORDER BY w.created_at LIMIT %(limit)s
)
SELECT live.member_id, live.address, live.capacity, clock.now - live.heartbeat_at, coalesce(busy.n, 0)
FROM live CROSS JOIN clock LEFT JOIN busy ON busy.owner = live.member_id
UNION ALL
SELECT NULL, NULL, count(*), clock.now - min(waiting.created_at), NULL FROM waiting CROSS JOIN clock GROUP BY clock.now
"""


@attrs.frozen
class Capacity:
    """The cluster as one read saw it (``members``: each live member's capacity, running, free, heartbeat age)."""

    members: tuple[Mapping[str, Any], ...]
    free_slots: int
    queued: int
    running: int
    oldest_queued_age: float | None

    def to_json(self) -> dict[str, Any]:
        return {"members": list(self.members), "free_slots": self.free_slots, "queued": self.queued,
                "running": self.running, "oldest_queued_age": self.oldest_queued_age}


def _decide(rows: list[tuple[Any, ...]]) -> Capacity:
    members: list[dict[str, Any]] = []
    queued, oldest = 0, None
    for member, address, capacity, age, running in rows:
        if member is None:  # the queue's row
            queued, oldest = int(capacity), (None if age is None else round(max(0.0, float(age)), 3))
            continue
        members.append({"member": member, "address": address, "capacity": int(capacity), "running": int(running),
                        "free": max(0, int(capacity) - int(running)), "heartbeat_age": round(float(age), 3)})
    return Capacity(tuple(members), sum(m["free"] for m in members), queued, sum(m["running"] for m in members),
                    oldest)


async def read_capacity(store: PgJournal, ttl: float) -> Capacity:
    """One bounded statement: members whose heartbeat is younger than ``ttl``, what they run, and the queue."""
    params = {"now": store.lease_clock() if store.lease_clock is not None else None, "ttl": ttl,
              "members": MAX_MEMBERS, "limit": QUEUE_COUNT_LIMIT}
    rows = await store.db.call(lambda conn: conn.execute(_QUERY, params).fetchall(), "status")
    return _decide(rows)


@attrs.define(eq=False)
class CapacityBoard:
    """What a member publishes: its own slots (exact, updated as it claims and finishes) and the last
    :class:`Capacity` its heartbeat read (``agentd ctl status``'s ``cluster`` section, the metrics)."""

    member: str
    capacity: int
    running: int = 0
    last: Capacity | None = None
    #: ``trio.current_time()`` of the last read (None: not read yet).
    read_at: float | None = None

    def to_json(self, now: float) -> dict[str, Any]:
        body: dict[str, Any] = {"member": {"id": self.member, "capacity": self.capacity, "running": self.running,
                                           "free_slots": max(0, self.capacity - self.running)}}
        if self.last is None or self.read_at is None:
            return {**body, "members": None, "free_slots": None, "queued": None, "running": None,
                    "oldest_queued_age": None, "read_age": None}
        return {**body, **self.last.to_json(), "read_age": round(max(0.0, now - self.read_at), 3)}
