"""A dead member's lease, as the database saw it: when it expired and when another member took the work.

A failover bound measured on the test's wall clock measures the test too: on a loaded machine its own process
is late to kill, late to look, late to see the item done, and the run after the takeover is a real process
that load slows down as much as it likes. What a lease promises is about two moments the database records on
its own clock: the lease's expiry (``agentd_leases.expires_at``, pushed back by every heartbeat) and the
takeover (``agentd_work.claimed_at``). These helpers read those, so a test bounds the takeover from the expiry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from agentd.cluster.member import POLL_INTERVAL
from agentd.cluster.store import PgJournal


def takeover(ttl: float) -> float:
    """How long after a dead member's lease expired the other members have taken its work (seconds, the
    database's clock): their claimers look at least every POLL_INTERVAL (agentd.cluster.member), and a look is
    one statement, given a heartbeat period (``ttl / 3``) on a loaded machine."""
    return POLL_INTERVAL + ttl / 3


async def lease_row(store: PgJournal, work_id: str) -> tuple[str, float] | None:
    """The item's lease row: its owner and when it expires (the database's clock); None once released."""
    row = await store.db.call(lambda conn: conn.execute(
        "SELECT owner, expires_at FROM agentd_leases WHERE run_id = %s", (work_id,)).fetchone(), "test read")
    return None if row is None else (str(row[0]), float(row[1]))


async def lease_expiry_past(store: PgJournal, work_id: str, kill: Callable[[], Awaitable[None]],
                            ttl: float) -> tuple[float, float]:
    """``kill()`` the item's owner (return once it is gone) and return when its lease on the item expires, as
    (earliest, latest): exactly as the lease row says once the owner is gone (no heartbeat renews it any more);
    if the item has moved on already by then, from what the row said just before the kill, which one more
    heartbeat (every ``ttl / 3``) may have pushed back."""
    before = await lease_row(store, work_id)
    assert before is not None, f"{work_id} has no lease"
    with trio.fail_after(30):
        await kill()
    after = await lease_row(store, work_id)
    if after is not None and after[0] == before[0]:
        return after[1], after[1]
    return before[1], before[1] + ttl / 3


async def last_claimed_at(store: PgJournal, work_id: str) -> float:
    """When the item was last claimed (the database's clock)."""
    row = await store.db.call(lambda conn: conn.execute(
        "SELECT claimed_at FROM agentd_work WHERE work_id = %s", (work_id,)).fetchone(), "test read")
    assert row is not None and row[0] is not None, f"{work_id} was never claimed"
    return float(row[0])
