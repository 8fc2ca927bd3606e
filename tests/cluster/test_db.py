"""agentd.cluster.db's error mapping on a real server: a statement the server cancelled (its statement time-out,
an operator's ``pg_cancel_backend``) is the database being unavailable for now, retried by the caller with
backoff, not a failed query; the next call goes through on a fresh connection."""

from __future__ import annotations

from typing import Any

import trio

from agentd.cluster.db import Database
from agentd.cluster.errors import ClusterUnavailable
from agentd.journal.errors import JournalError
from tests.postgres import PASSWORD
from tests.waiting import until


async def test_a_cancelled_statement_is_unavailable_and_the_next_call_reconnects(pg_dsn: str) -> None:
    db = Database(pg_dsn, PASSWORD, "the test database")
    operator = Database(pg_dsn, PASSWORD, "the operator")
    try:
        pid = await db.call(lambda conn: conn.execute("SELECT pg_backend_pid()").fetchone()[0])

        def cancel(conn: Any) -> bool:
            rows = conn.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = %s "
                                "AND state = 'active' AND query LIKE 'SELECT pg_sleep%%'", (pid,)).fetchall()
            return bool(rows and rows[0][0])

        async def cancel_the_sleep() -> None:
            await until(lambda: operator.call(cancel, "cancel"), timeout=30, what="the sleep cancelled")

        caught: JournalError | None = None
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_the_sleep)
                try:
                    await db.call(lambda conn: conn.execute("SELECT pg_sleep(20)"), "sleep")
                except JournalError as exc:
                    caught = exc
        assert isinstance(caught, ClusterUnavailable), repr(caught)
        assert "interrupted" in str(caught) and "the test database" in str(caught)
        again = await db.call(lambda conn: conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert again != pid  # a fresh connection
    finally:
        await db.aclose()
        await operator.aclose()
