"""One psycopg connection driven from trio: psycopg's sync API on one bounded worker thread.

Why a thread: psycopg's async API needs asyncio; agentd runs on trio. As the SQLite journal does, every call
runs in ``trio.to_thread.run_sync`` under a ``CapacityLimiter(1)``: one worker thread at a time touches the
connection, and a slow or unreachable database delays only the task awaiting it, never the trio loop.
Every wait is bounded on the database side: ``connect_timeout``, a ``statement_timeout`` and TCP
keepalives, so a thread call always returns.

The session runs with ``synchronous_commit = on`` (a connection option, which outranks the server's
``postgresql.conf``/``ALTER SYSTEM``, the database's and the role's defaults): a commit of agentd returns once
the server has the transaction in its WAL, so a crash of the server loses nothing agentd was told was
committed. The one exception is a journal batch nothing acts on (agentd.cluster.store), which asks for
``off`` itself.

A connection that broke (the server restarted, the network dropped) raises
:class:`~agentd.cluster.errors.ClusterUnavailable` once and is opened again by the next call: the caller
decides whether to retry (agentd.backoff) or give up. Messages name the host, never the password.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import psycopg
import trio

from agentd.cluster.errors import ClusterUnavailable
from agentd.journal.errors import JournalError

#: Seconds libpq waits for a connection to be established.
CONNECT_TIMEOUT: Final = 5
#: Longest a single statement may run on the server (milliseconds).
STATEMENT_TIMEOUT_MS: Final = 30_000
#: Longest the server keeps a session that sits idle inside a transaction (seconds): a member cut off or paused
#: between two statements of a transaction holds its row locks (a lease row, say) until the server ends the
#: session, and no other member could take its work over meanwhile. A live member never waits between the
#: statements of one transaction (each is one call on the worker thread), so its transactions never meet it.
IDLE_IN_TRANSACTION_TIMEOUT: Final = 5
#: Longest sent data may stay unacknowledged before the client's kernel drops the connection (milliseconds):
#: TCP keepalives do not run while a statement is in flight, so without it a member cut off mid-statement
#: would hang until TCP gives up (about 15 minutes), unable to heartbeat or notice its lost lease.
TCP_USER_TIMEOUT_MS: Final = 10_000
#: Bound on closing the connection when its owner is cancelled.
CLOSE_GRACE: Final = 5.0

T = TypeVar("T")


class Database:
    """A lazily (re)opened autocommit connection; :meth:`call` runs blocking work on the worker thread."""

    def __init__(self, conninfo: str, password: str | None, where: str, *, application: str = "agentd") -> None:
        self._conninfo = conninfo
        self._password = password
        self.where = where  # host:port/database, never a password
        self._application = application
        self._conn: psycopg.Connection[Any] | None = None
        self._limiter = trio.CapacityLimiter(1)

    def _connect(self) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {"password": self._password} if self._password else {}
        try:
            return psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name=self._application,
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c synchronous_commit=on "
                f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT * 1000}", keepalives=1, keepalives_idle=10,
                keepalives_interval=5, keepalives_count=3, tcp_user_timeout=TCP_USER_TIMEOUT_MS, **extra,
            )
        except psycopg.Error as exc:
            raise ClusterUnavailable(f"cluster database {self.where}: cannot connect ({_reason(exc)})") from None

    def run(self, work: Callable[[psycopg.Connection[Any]], T], what: str) -> T:
        """On the worker thread: ``work(connection)``; connection failures become ClusterUnavailable."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._close_quietly()
            self._conn = self._connect()
        conn = self._conn
        try:
            return work(conn)
        except (psycopg.errors.QueryCanceled, psycopg.errors.AdminShutdown) as exc:
            # Before OperationalError, which both are: a statement the server cancelled or a server shutting
            # down is the database away for now, retried by the caller, not a failed query.
            self._close_quietly()
            raise ClusterUnavailable(f"cluster database {self.where}: {what} interrupted ({_reason(exc)})") from None
        except psycopg.OperationalError as exc:
            if conn.broken or conn.closed:
                self._close_quietly()
                raise ClusterUnavailable(f"cluster database {self.where}: connection lost ({_reason(exc)})") from None
            raise JournalError(f"cluster database {self.where}: {what} failed ({_reason(exc)})") from None
        except psycopg.Error as exc:
            raise JournalError(f"cluster database {self.where}: {what} failed ({_reason(exc)})") from None

    def locator(self) -> dict[str, Any]:
        """How a child process of this member reaches the same database (its run's journal): the connection
        string, the password and the display name. Holds the password: sent only over the private channel to
        a child (agentd.supervisor), never logged, written or put in argv or the environment."""
        return {"conninfo": self._conninfo, "password": self._password, "where": self.where}

    async def call(self, work: Callable[[psycopg.Connection[Any]], T], what: str = "query") -> T:
        return await trio.to_thread.run_sync(lambda: self.run(work, what), limiter=self._limiter)

    def _close_quietly(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    async def aclose(self) -> None:
        with trio.move_on_after(CLOSE_GRACE, shield=True):
            await trio.to_thread.run_sync(self._close_quietly, limiter=self._limiter)


def _reason(exc: BaseException) -> str:
    """libpq's first line (it names host and user, never the password), without the SQL context."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
