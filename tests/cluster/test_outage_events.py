"""The events a member logs when it loses the database: ``cluster.unavailable`` once when it notices, and
``cluster.available`` when the database answers again, whichever part noticed (the heartbeat, the claimer, or
a running item's commit), so an operator's alert on the one is always cleared by the other."""

from __future__ import annotations

from typing import Any

import trio

from agentd.cluster.member import Member
from agentd.cluster.store import FencedJournal, open_database, open_pg_journal
from agentd.cluster.work import Queue, WorkItem, enqueue
from agentd.journal.records import RunStarted
from agentd.telemetry.events import EventLog
from tests.postgres import PASSWORD
from tests.waiting import until


async def test_an_outage_only_a_running_commit_saw_is_followed_by_available(pg_server: Any, pg_dsn: str) -> None:
    lines: list[dict[str, Any]] = []
    entered, go, committed = trio.Event(), trio.Event(), trio.Event()

    async def execute(item: WorkItem, journal: FencedJournal) -> None:
        entered.set()
        await go.wait()
        await journal.append(item.work_id, [RunStarted("digest", "the item")])
        committed.set()

    def events() -> list[str]:
        return [str(line.get("event")) for line in lines if str(line.get("event")).startswith("cluster.")]

    async def seen(name: str) -> None:
        await until(lambda: name in events(), timeout=90, what=name)

    with trio.fail_after(90):
        async with open_pg_journal(pg_dsn, PASSWORD) as store, trio.open_nursery() as nursery:
            listen = await open_database(pg_dsn, PASSWORD, "listen")
            try:
                # Capacity 1 (the claimer has nothing to do while the item runs) and a long lease (no heartbeat
                # during the test): the item's commit is the only part that meets the outage.
                member = Member(Queue(store, "m", None, 1), execute, EventLog(sink=lines.append), ttl=120,
                                listen_db=listen)
                await nursery.start(member.serve)
                await enqueue(store, "w", "run", {"instruction": "the item"})
                await entered.wait()
                await trio.to_thread.run_sync(pg_server.stop)
                try:
                    go.set()
                    await seen("cluster.unavailable")
                finally:
                    await trio.to_thread.run_sync(pg_server.start)
                await committed.wait()
                await seen("cluster.available")
                nursery.cancel_scope.cancel()
            finally:
                await listen.aclose()
    assert events().count("cluster.unavailable") == 1, events()
    assert events().index("cluster.unavailable") < events().index("cluster.available")
