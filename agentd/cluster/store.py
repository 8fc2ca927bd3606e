"""The run journal on PostgreSQL: the same :class:`~agentd.journal.store.JournalStore` as the SQLite file,
shared by every member of a cluster, plus fencing.

Why the same interface: the run composition (agentd.run) journals and resumes runs through the Protocol only,
so a run recovered on another member is the durable-runs recovery path unchanged (docs/durability.md).

Durability: every method is one transaction, and agentd's session runs with ``synchronous_commit = on``
(agentd.cluster.db), whatever the server's, the database's or the role's default. A run's records that agentd
acts on outside the journal next (a step that asks for tool calls, a task id, ``RunEnded``: ``durable=True``,
see agentd.journal.recorder) are flushed to the server's WAL before the commit returns, so a crash of the
database server itself (not only of agentd) keeps them; the others commit with ``synchronous_commit = off``:
the WAL is written in order and a synchronous commit flushes it up to its own record, so the next one
(which comes before agentd acts on them outside) secures them too.

Group commit: appends go through :class:`~agentd.journal.group.GroupCommit`: the batches of every run that
arrive while a transaction is on the worker thread are committed together in the next one (one WAL flush
for all of them), each fenced on its own lease, each with its own outcome (a lost lease refuses that batch
alone). A transaction the server aborts as a deadlock (a claim racing the lease checks of a group) is tried
again, :data:`DEADLOCK_RETRIES` times.

Leases and fencing: :meth:`PgJournal.claim` takes a run for an owner until ``expires_at`` (the database's
clock, so members' clocks do not matter) with a token from one sequence, so tokens only grow across the
cluster. :meth:`PgJournal.append_fenced` commits only while the lease row still carries the caller's token
(checked under a row lock in the same transaction); otherwise it raises
:class:`~agentd.cluster.errors.LeaseLost` and writes nothing. :class:`FencedJournal` is the JournalStore a
claimed run uses, so every one of its commits is fenced.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import attrs
import psycopg
import trio

from agentd.backoff import exponential
from agentd.cluster import migrations
from agentd.cluster.db import Database
from agentd.cluster.errors import ClusterUnavailable, LeaseLost
from agentd.journal.group import GroupCommit, Pending
from agentd.journal.records import Record, RunEnded, RunStarted, decode, encode_json, redacted
from agentd.journal.store import Entry, Lease, Retention, RunJournal, RunSummary
from agentd.telemetry.events import Redactor

if TYPE_CHECKING:
    from agentd.journal.store import JournalStore

Conn = psycopg.Connection[Any]
_RUN_COLUMNS = "run_id, status, started_at, ended_at, parent, next_seq"


def _summary(row: Sequence[Any]) -> RunSummary:
    run_id, status, started_at, ended_at, parent, next_seq = row
    return RunSummary(run_id, status, started_at, ended_at, parent, next_seq)


def _bodies(records: Sequence[Record]) -> list[tuple[str, str]]:
    return [(r.KIND, encode_json(r)) for r in records]


def db_now(conn: Conn) -> float:
    row = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def append_in(conn: Conn, run_id: str, records: Sequence[Record], now: float) -> int:
    """Inside an open transaction: append ``records`` to ``run_id``; the last sequence number."""
    bodies = _bodies(records)
    ended = next((r for r in records if isinstance(r, RunEnded)), None)
    started = next((r for r in records if isinstance(r, RunStarted)), None)
    parent = started.parent if started is not None else None
    conn.execute("INSERT INTO agentd_runs (run_id, status, started_at, parent, next_seq) "
                 "VALUES (%s, 'running', %s, %s, 0) ON CONFLICT (run_id) DO NOTHING", (run_id, now, parent))
    row = conn.execute("SELECT next_seq FROM agentd_runs WHERE run_id = %s FOR UPDATE", (run_id,)).fetchone()
    assert row is not None
    first = int(row[0])
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO agentd_entries (run_id, seq, ts, kind, body) VALUES (%s, %s, %s, %s, %s)",
                        [(run_id, first + i, now, kind, body) for i, (kind, body) in enumerate(bodies)])
    last = first + len(bodies)
    if ended is not None:
        conn.execute("UPDATE agentd_runs SET next_seq = %s, status = %s, ended_at = %s WHERE run_id = %s",
                     (last, ended.status, now, run_id))
    elif started is not None and parent is not None:
        conn.execute("UPDATE agentd_runs SET next_seq = %s, parent = %s WHERE run_id = %s", (last, parent, run_id))
    else:
        conn.execute("UPDATE agentd_runs SET next_seq = %s WHERE run_id = %s", (last, run_id))
    return last - 1


def _sync(conn: Conn, durable: bool) -> None:
    conn.execute(f"SET LOCAL synchronous_commit = {'on' if durable else 'off'}")


def check_fence(conn: Conn, lease: Lease) -> None:
    """Inside an open transaction: the lease row still carries ``lease.token``, locked against a re-claim
    until the transaction ends; else :class:`LeaseLost` (naming the new owner, if any)."""
    row = conn.execute("SELECT owner, token FROM agentd_leases WHERE run_id = %s FOR SHARE",
                       (lease.run_id,)).fetchone()
    if row is None or int(row[1]) != lease.token:
        raise lost_lease(lease, row)


def lost_lease(lease: Lease, row: Sequence[Any] | None) -> LeaseLost:
    """The refusal of a commit fenced by ``lease``, whose lease row is now ``row`` (owner, token; None: gone)."""
    owner, token = (None, None) if row is None else (str(row[0]), int(row[1]))
    return LeaseLost(f"run {lease.run_id!r}: lease {lease.token} of {lease.owner!r} was lost "
                     f"({'released' if row is None else f'now held by {owner!r} with token {token}'}); "
                     "nothing was committed", work=lease.run_id, token=lease.token, new_owner=owner,
                     new_token=token)


def claim_in(conn: Conn, run_id: str, owner: str, ttl: float, now: float) -> Lease | None:
    """Inside an open transaction: take the run's lease unless another owner's is live (atomic upsert)."""
    row = conn.execute(
        "INSERT INTO agentd_leases AS l (run_id, owner, token, expires_at) "
        "VALUES (%(run)s, %(owner)s, nextval('agentd_fence'), %(exp)s) "
        "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
        "expires_at = excluded.expires_at WHERE l.expires_at <= %(now)s OR l.owner = excluded.owner "
        "RETURNING token, expires_at",
        {"run": run_id, "owner": owner, "exp": now + ttl, "now": now},
    ).fetchone()
    return None if row is None else Lease(run_id, owner, int(row[0]), float(row[1]))


#: Times a group commit the server aborted as a deadlock is tried again before it fails as a journal error.
DEADLOCK_RETRIES: Final = 3


@attrs.frozen
class _Batch:
    """One append waiting for its group: a claimed run's batch carries the lease it is fenced by."""

    run_id: str
    records: tuple[Record, ...]
    durable: bool
    now: float
    lease: Lease | None


def _commit_group(conn: Conn, group: Sequence[Pending[_Batch, int]]
                  ) -> list[tuple[Pending[_Batch, int], int | None, LeaseLost | None]]:
    """On the worker thread: every batch of ``group`` in one transaction, synchronous if any is durable. A
    batch whose lease was lost writes nothing (its fence check is its first statement) and gets its
    LeaseLost; the others commit."""
    out: list[tuple[Pending[_Batch, int], int | None, LeaseLost | None]] = []
    with conn.transaction():
        _sync(conn, any(p.batch.durable for p in group))
        for pending in group:
            batch = pending.batch
            if batch.lease is not None:
                try:
                    check_fence(conn, batch.lease)
                except LeaseLost as exc:
                    out.append((pending, None, exc))
                    continue
            out.append((pending, append_in(conn, batch.run_id, batch.records, batch.now), None))
    return out


@attrs.define(eq=False)
class PgJournal:
    """:class:`~agentd.journal.store.JournalStore` on a PostgreSQL database. Use :func:`open_pg_journal`."""

    db: Database
    #: Record timestamps; lease times use the database's clock unless ``lease_clock`` is set (tests).
    clock: Callable[[], float] = time.time
    lease_clock: Callable[[], float] | None = None
    #: Known secret values (the log's): scrubbed out of every record and state value before it is written.
    redactor: Redactor | None = None
    #: Every append goes through it (group commit, agentd.journal.group).
    writer: GroupCommit[_Batch, int] = attrs.field(init=False)

    @writer.default
    def _writer(self) -> GroupCommit[_Batch, int]:
        return GroupCommit(self._flush)

    @property
    def path(self) -> str:
        return self.db.where

    def now_in(self, conn: Conn) -> float:
        return self.lease_clock() if self.lease_clock is not None else db_now(conn)

    # --- runs ---

    async def append(self, run_id: str, records: Sequence[Record], *, durable: bool = False) -> int:
        return await self._submit(run_id, records, durable, None)

    async def append_fenced(self, lease: Lease, records: Sequence[Record], *, durable: bool = False,
                            run_id: str | None = None) -> int:
        """:meth:`append` to ``lease.run_id`` (or ``run_id``, a run of its tree: a subagent's) only while
        ``lease`` holds; else LeaseLost and nothing written."""
        return await self._submit(run_id or lease.run_id, records, durable, lease)

    async def _submit(self, run_id: str, records: Sequence[Record], durable: bool, lease: Lease | None) -> int:
        if not records:
            raise ValueError("append needs at least one record")
        batch = tuple(redacted(r, self.redactor) for r in records)
        return await self.writer.submit(_Batch(run_id, batch, durable, self.clock(), lease))

    async def _flush(self, group: Sequence[Pending[_Batch, int]]) -> None:
        """One transaction for the whole group (see the module docstring); each batch settled on its own."""

        def work(conn: Conn) -> list[tuple[Pending[_Batch, int], int | None, LeaseLost | None]]:
            for attempt in range(DEADLOCK_RETRIES + 1):
                try:
                    return _commit_group(conn, group)
                except psycopg.errors.DeadlockDetected:
                    if attempt == DEADLOCK_RETRIES:
                        raise
            raise AssertionError("unreachable")

        for pending, last, lost in await self.db.call(work, "append"):
            pending.settle(last, lost)

    async def read_run(self, run_id: str) -> RunJournal | None:
        def work(conn: Conn) -> tuple[Any, list[Any]]:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM agentd_runs WHERE run_id = %s", (run_id,)).fetchone()
                if row is None:
                    return None, []
                rows = conn.execute("SELECT seq, ts, body FROM agentd_entries WHERE run_id = %s ORDER BY seq",
                                    (run_id,)).fetchall()
                return row, rows

        row, rows = await self.db.call(work, "read")
        if row is None:
            return None
        return RunJournal(_summary(row), tuple(Entry(seq, ts, decode(json.loads(body))) for seq, ts, body in rows))

    async def _runs(self, where: str, params: tuple[Any, ...], order: str) -> list[RunSummary]:
        sql = f"SELECT {_RUN_COLUMNS} FROM agentd_runs {where} {order}"
        rows = await self.db.call(lambda conn: conn.execute(sql.encode(), params).fetchall(), "read")
        return [_summary(r) for r in rows]

    async def list_runs(self, *, limit: int = 50, status: str | None = None) -> list[RunSummary]:
        order = f"ORDER BY started_at DESC, run_id LIMIT {int(limit)}"
        if status is None:
            return await self._runs("", (), order)
        return await self._runs("WHERE status = %s", (status,), order)

    async def unfinished_runs(self) -> list[RunSummary]:
        return await self._runs("WHERE ended_at IS NULL", (), "ORDER BY started_at, run_id")

    async def prune(self, retention: Retention, *, now: float | None = None) -> int:
        at = self.clock() if now is None else now

        def work(conn: Conn) -> int:
            with conn.transaction():
                doomed: set[str] = set()
                if retention.keep_days is not None:
                    cutoff = at - retention.keep_days * 86400
                    doomed.update(r[0] for r in conn.execute(
                        "SELECT run_id FROM agentd_runs WHERE ended_at IS NOT NULL AND ended_at < %s", (cutoff,)))
                if retention.keep_runs is not None:
                    doomed.update(r[0] for r in conn.execute(
                        "SELECT run_id FROM agentd_runs WHERE ended_at IS NOT NULL "
                        "ORDER BY ended_at DESC, run_id DESC OFFSET %s", (retention.keep_runs,)))
                doomed -= retention.keep
                if doomed:
                    ids = sorted(doomed)
                    conn.execute("DELETE FROM agentd_entries WHERE run_id = ANY(%s)", (ids,))
                    conn.execute("DELETE FROM agentd_runs WHERE run_id = ANY(%s)", (ids,))
                return len(doomed)

        return await self.db.call(work, "prune")

    # --- daemon state ---

    async def get_state(self, namespace: str) -> dict[str, Any]:
        rows = await self.db.call(lambda conn: conn.execute(
            "SELECT key, value FROM agentd_state WHERE namespace = %s", (namespace,)).fetchall(), "read")
        return {key: json.loads(value) for key, value in rows}

    async def put_state(self, namespace: str, changes: Mapping[str, Any]) -> None:
        scrub = self.redactor.scrub_value if self.redactor is not None else (lambda value: value)
        encoded = {k: None if v is None else json.dumps(scrub(v), separators=(",", ":")) for k, v in changes.items()}
        now = self.clock()

        def work(conn: Conn) -> None:
            with conn.transaction():
                _sync(conn, True)
                for key, value in encoded.items():
                    if value is None:
                        conn.execute("DELETE FROM agentd_state WHERE namespace = %s AND key = %s", (namespace, key))
                    else:
                        conn.execute(
                            "INSERT INTO agentd_state (namespace, key, value, updated_at) VALUES (%s, %s, %s, %s) "
                            "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                            "updated_at = excluded.updated_at", (namespace, key, value, now))

        await self.db.call(work, "state write")

    # --- leases ---

    async def claim(self, run_id: str, owner: str, *, ttl: float) -> Lease | None:
        def work(conn: Conn) -> Lease | None:
            with conn.transaction():
                return claim_in(conn, run_id, owner, ttl, self.now_in(conn))

        return await self.db.call(work, "claim")

    async def renew(self, lease: Lease, *, ttl: float) -> Lease | None:
        def work(conn: Conn) -> Lease | None:
            with conn.transaction():
                row = conn.execute(
                    "UPDATE agentd_leases SET expires_at = %s WHERE run_id = %s AND token = %s RETURNING expires_at",
                    (self.now_in(conn) + ttl, lease.run_id, lease.token)).fetchone()
                return None if row is None else attrs.evolve(lease, expires_at=float(row[0]))

        return await self.db.call(work, "renew")

    async def release(self, lease: Lease) -> None:
        await self.db.call(lambda conn: conn.execute(
            "DELETE FROM agentd_leases WHERE run_id = %s AND token = %s", (lease.run_id, lease.token)), "release")

    async def aclose(self) -> None:
        await self.db.aclose()


#: Backoff of a fenced commit while the database is unreachable (agentd.backoff): base and cap in seconds.
RETRY_BASE = 0.2
RETRY_CAP = 5.0


@attrs.define(eq=False)
class _Through:
    """A JournalStore view of a member's :class:`PgJournal` that passes every method through; the views below
    change only what they must. Closing a view closes nothing: the member owns the store."""

    store: PgJournal

    async def append(self, run_id: str, records: Sequence[Record], *, durable: bool = False) -> int:
        return await self.store.append(run_id, records, durable=durable)

    async def read_run(self, run_id: str) -> RunJournal | None:
        return await self.store.read_run(run_id)

    async def list_runs(self, *, limit: int = 50, status: str | None = None) -> list[RunSummary]:
        return await self.store.list_runs(limit=limit, status=status)

    async def unfinished_runs(self) -> list[RunSummary]:
        return await self.store.unfinished_runs()

    async def get_state(self, namespace: str) -> dict[str, Any]:
        return await self.store.get_state(namespace)

    async def put_state(self, namespace: str, changes: Mapping[str, Any]) -> None:
        await self.store.put_state(namespace, changes)

    async def prune(self, retention: Retention, *, now: float | None = None) -> int:
        return await self.store.prune(retention, now=now)

    async def claim(self, run_id: str, owner: str, *, ttl: float) -> Lease | None:
        return await self.store.claim(run_id, owner, ttl=ttl)

    async def renew(self, lease: Lease, *, ttl: float) -> Lease | None:
        return await self.store.renew(lease, ttl=ttl)

    async def release(self, lease: Lease) -> None:
        await self.store.release(lease)

    async def aclose(self) -> None:
        """The member owns the store."""


@attrs.define(eq=False)
class FencedJournal(_Through):
    """The JournalStore a claimed run writes through: every append is fenced by the run's lease. The runs of its
    subagents (``RUN/...``, docs/durability.md) are fenced by the same lease: a member that lost the item can
    commit nothing for any run of its tree.

    While the database is unreachable an append waits and retries with backoff (the run pauses at its next
    commit instead of failing); once it is back, the commit goes through if the lease still holds and
    raises :class:`LeaseLost` (nothing written) if another member took the run meanwhile.
    """

    lease: Lease
    on_unavailable: Callable[[ClusterUnavailable, int], None] | None = None

    async def append(self, run_id: str, records: Sequence[Record], *, durable: bool = False) -> int:
        if run_id != self.lease.run_id and not run_id.startswith(self.lease.run_id + "/"):
            raise LeaseLost(f"run {run_id!r}: not the leased run {self.lease.run_id!r} or one of its subagents'")
        attempt = 0
        while True:
            try:
                return await self.store.append_fenced(self.lease, records, durable=durable, run_id=run_id)
            except ClusterUnavailable as exc:
                attempt += 1
                if self.on_unavailable is not None:
                    self.on_unavailable(exc, attempt)
                await trio.sleep(exponential(attempt, RETRY_BASE, RETRY_CAP))


@attrs.define(eq=False)
class MemberJournal(_Through):
    """The shared journal as one member's daemon sees it: runs are shared, daemon state is the member's own.

    Daemon state (the agent's own subscriptions and self-scheduled runs) belongs to one daemon: shared, every
    member would re-arm every other member's schedules. Its namespaces are prefixed with the member's run id
    (``--run-id``), so a member restarted with the same ``--run-id`` gets its state back.
    """

    scope: str

    def _ns(self, namespace: str) -> str:
        return f"{self.scope}/{namespace}"

    async def get_state(self, namespace: str) -> dict[str, Any]:
        return await self.store.get_state(self._ns(namespace))

    async def put_state(self, namespace: str, changes: Mapping[str, Any]) -> None:
        await self.store.put_state(self._ns(namespace), changes)


def child_locator(store: PgJournal, lease: Lease | None) -> dict[str, Any]:
    """Where the subagents of a run journal (:func:`open_fenced_journal` in the child): the database and the
    lease of the work item the run is (None: a member's own run or wake, which no lease fences). Holds the
    password: for the private channel to a child only."""
    return {"cluster": {**store.db.locator(), "lease": None if lease is None else attrs.asdict(lease)}}


@asynccontextmanager
async def open_fenced_journal(located: Mapping[str, Any], *, redactor: Redactor | None = None
                              ) -> AsyncIterator[JournalStore]:
    """A subagent's journal in a cluster: its own connection to the member's database (``located``, from
    :func:`child_locator`), every append fenced by the lease of the work item its tree runs, if it runs one, so
    a child of a member that lost the item commits nothing. Raises ClusterUnavailable or ClusterSchemaError
    when it cannot be opened; closed, shielded and bounded, on exit."""
    leased = located.get("lease")
    password = located.get("password")
    if redactor is not None and isinstance(password, str) and password:
        redactor.add(password)
    db = await open_database(str(located["conninfo"]), password if isinstance(password, str) else None,
                             str(located.get("where") or "cluster database"), application="agentd-child")
    store = PgJournal(db, redactor=redactor)
    try:
        yield FencedJournal(store, Lease(**leased)) if isinstance(leased, dict) else _Through(store)
    finally:
        await store.aclose()


async def open_database(conninfo: str, password: str | None, where: str, *, migrate: bool = False,
                        application: str = "agentd") -> Database:
    """A :class:`Database` whose schema was checked (created on an empty database); raises
    ClusterUnavailable (exit 6) or ClusterSchemaError (exit 2)."""
    db = Database(conninfo, password, where, application=application)
    try:
        await db.call(lambda conn: migrations.check(conn, where, migrate=migrate), "schema check")
    except BaseException:
        await db.aclose()
        raise
    return db


@asynccontextmanager
async def open_pg_journal(conninfo: str, password: str | None = None, *, where: str | None = None,
                          clock: Callable[[], float] = time.time,
                          lease_clock: Callable[[], float] | None = None) -> AsyncIterator[PgJournal]:
    """The journal on the database at ``conninfo`` (schema checked), closed, shielded and bounded, on exit."""
    db = await open_database(conninfo, password, where or conninfo)
    journal = PgJournal(db, clock, lease_clock)
    try:
        yield journal
    finally:
        await journal.aclose()


if TYPE_CHECKING:

    def _implements_the_interface(journal: PgJournal, fenced: FencedJournal, member: MemberJournal
                                  ) -> tuple[JournalStore, JournalStore, JournalStore]:
        return journal, fenced, member
