"""The journal on an embedded SQLite file: ``<state dir>/journal.sqlite3``, for one daemon process.

Why a thread: ``sqlite3`` is blocking I/O. Every database call runs on the journal's own thread
(:class:`Worker`, the contract of ``trio.to_thread.run_sync`` under a ``CapacityLimiter(1)`` at half its
cost): one thread touches the connection, and a slow disk delays only the run that awaits its commit, never
the trio loop. Records are JSON-encoded on the worker thread too, so the trio thread pays only the hand-off.

Durability: WAL mode. Each :meth:`SqliteJournal.append` batch (one step's records) is in the journal entirely
or not at all, and every committed batch survives the process being killed (SIGKILL, OOM): it is in the WAL,
in the kernel's page cache. What must also survive a power loss or an OS crash before agentd acts on it
outside the journal is committed with ``synchronous=FULL`` (``durable=True``, chosen by the caller,
agentd.journal.recorder; and every :meth:`SqliteJournal.put_state`): an fsync of the WAL before the commit
returns. The WAL is one file written in commit order and recovered only up to its first invalid frame, so
that fsync also secures every earlier commit of the file, whichever connection or process wrote it; the
other commits (``synchronous=NORMAL``) are durable once a later FULL commit or a checkpoint synced the WAL,
and a power loss before that loses them whole, never corrupting the file.

The WAL is kept and reused, not grown: after a checkpoint has copied it back, the next commit writes it again
from its start, in place, and ``journal_size_limit`` (:data:`WAL_KEEP`, far above what one checkpoint interval
fills) leaves it its size. What the fsync of a durable commit costs depends on that: ``fdatasync`` of a write
that makes the file longer must also commit the file system's metadata (ext4: new blocks allocated, the size
changed), one that overwrites does not. A fresh file's WAL grows until the first checkpoint (about
``wal_autocheckpoint``, 1000 pages, some 4 MB); a daemon's stays at that size from then on (it is deleted only
when the file's last connection closes).

Sequence numbers: a run's records are numbered from 0 in append order, the entries' key ``(run_id, seq)``. A
batch reads its run's last number (a seek to the run's last entry) and writes no page of ``runs``: the run's
row is written by its first batch and by its ``RunEnded`` (status, end, ``next_seq``), so a step's commit
writes only the entries' pages. A running run's record count is read from its entries.

Writers of several processes (a tree's children journal into the root's file): SQLite lets one writer in at
a time and makes the others poll, sleeping up to tens of milliseconds between tries, which costs a fan-out of
children far more than their commits. So every write transaction first takes an exclusive ``flock`` of a
companion file, ``journal.sqlite3-lock``: a writer that finds it taken waits in the kernel until it is let go
(woken at once, no polling), and after :data:`BUSY_TIMEOUT` seconds goes on without it (SQLite's own lock
still serialises the writers; the flock only shortens the wait). The kernel drops it with its process.

Group commit: appends go through :class:`~agentd.journal.group.GroupCommit`, so the batches of concurrent
runs that queue while one transaction is on the worker thread share the next transaction and its one fsync.

Schema: declared once for both stores (agentd.journal.schema), rendered for SQLite by agentd.journal.ddl. A
``meta`` table holds ``schema_version``. A file with a newer version, or a database that is not a journal, is
refused with :class:`~agentd.journal.errors.JournalSchemaError` before anything is written; an older one is
brought up to date by the first writer to open it (migrations only add, so a reader of either version
reads it), in the same write transaction that re-reads its version.

Leases: one process owns the file, so :meth:`SqliteJournal.claim` and friends are in-memory bookkeeping
with the same contract (a live lease of another owner refuses a claim; tokens only grow).
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import attrs
import trio

from agentd.journal.ddl import SQLITE
from agentd.journal.errors import JournalError, JournalSchemaError
from agentd.journal.group import GroupCommit, Pending
from agentd.journal.records import Record, RunEnded, RunStarted, decode, encode_json, redacted
from agentd.journal.store import Entry, Lease, Retention, RunJournal, RunSummary
from agentd.telemetry.events import Redactor
from agentd.telemetry.private_files import prepare_database

if TYPE_CHECKING:
    from agentd.journal.store import JournalStore

#: The journal's file name inside the state directory.
DB_NAME: Final = "journal.sqlite3"
#: The schema this agentd writes (agentd.journal.schema, as SQLite holds it); a file with a larger one is refused.
SCHEMA_VERSION: Final = SQLITE.version
#: Seconds SQLite waits for a lock held by another connection (a reader such as ``agentd journal``).
BUSY_TIMEOUT: Final = 10.0
#: Bytes of WAL kept after a checkpoint (``PRAGMA journal_size_limit``): a WAL grown past it by a burst (a
#: checkpoint held off by a reader) is cut back to it; below it, the file keeps its size and is written in place.
WAL_KEEP: Final = 16 * 1024 * 1024
#: Bound on closing the store when its owner is cancelled.
CLOSE_GRACE: Final = 5.0
#: The writers' lock file beside the journal (see the module docstring).
LOCK_SUFFIX: Final = "-lock"

T = TypeVar("T")


#: A state value's text, compact (``json.dumps`` with options builds a new encoder per call; a budgeted run writes
#: its books every step).
_STATE_JSON: Final = json.JSONEncoder(separators=(",", ":")).encode
#: A run's last sequence number: a seek to its last entry (the entries' key is ``(run_id, seq)``).
_LAST_SEQ: Final = "SELECT seq FROM entries WHERE run_id = ? ORDER BY seq DESC LIMIT 1"
#: A run's summary, read from ``runs``: its record count is one past its last entry's sequence number (a running
#: run's ``next_seq`` is set by its first batch and its end, not by each step's); ``next_seq`` for a run with none.
_SUMMARY: Final = ("run_id, status, started_at, ended_at, parent, COALESCE((SELECT e.seq + 1 FROM entries AS e "
                   "WHERE e.run_id = runs.run_id ORDER BY e.seq DESC LIMIT 1), next_seq)")


def db_path(state_dir: str) -> str:
    return os.path.join(state_dir, DB_NAME)


def _summary(row: sqlite3.Row | tuple[Any, ...]) -> RunSummary:
    run_id, status, started_at, ended_at, parent, next_seq = row
    return RunSummary(run_id, status, started_at, ended_at, parent, next_seq)


def _take(lock: int) -> bool:
    """The writers' lock on ``lock``: at once if it is free, else within :data:`BUSY_TIMEOUT` seconds; whether
    it was taken.

    The wait is the kernel's (a blocking ``flock``, woken when the holder lets go), not a poll: under a fan-out
    of children committing at once, tries and sleeps cost each waiter more CPU than its own commit. A blocking
    ``flock`` has no timeout, so it runs on a helper thread (trio's ``start_thread_soon``) on a descriptor of
    its own (a ``dup``: the same open file, so the lock it takes is this one's); past the bound the caller goes
    on without the lock, and a helper that gets it later lets it go at once. Who decides is whoever first
    removes the ``waiting`` key (one ``dict.pop``: atomic in CPython)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    fd = os.dup(lock)
    got: queue.SimpleQueue[bool] = queue.SimpleQueue()
    waiting = {"waiting": True}

    def wait() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if waiting.pop("waiting", None) is None:  # the caller went on without it: let it go
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                got.put(True)
        except OSError:
            pass  # not taken: the caller's wait runs out
        finally:
            os.close(fd)

    trio.lowlevel.start_thread_soon(wait, lambda _: None, name="agentd-journal-lock")
    try:
        return got.get(timeout=BUSY_TIMEOUT)
    except queue.Empty:
        if waiting.pop("waiting", None) is not None:
            return False  # given up: the helper lets it go if it ever gets it
        return got.get()  # the helper got it just now


class _Taken(Exception):
    """A batch that starts a run the file already holds (see :meth:`JournalFile._append_in`)."""


class JournalFile:
    """The connection and every query, blocking. Touched by one thread at a time (the limiter's worker,
    or the CLI's main thread when opened ``readonly``)."""

    def __init__(self, path: str, *, readonly: bool = False, clock: Callable[[], float] = time.time,
                 checked: bool = False) -> None:
        self.path = path
        self.clock = clock
        #: The connection's ``synchronous`` is FULL now (it stays as the last write left it: a run whose steps
        #: all ask for tool calls switches it never).
        self._full = False
        #: A read-only open of a file whose schema is not created yet (the writer is just starting).
        self.empty = False
        #: The writers' lock file (a writer's only; see the module docstring).
        self._lock: int | None = None
        try:
            if readonly:
                self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False,
                                            isolation_level=None, timeout=BUSY_TIMEOUT)  # fmt: skip
            else:
                if not checked:  # (a checked file: its directory and modes were prepared by its first opener)
                    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
                    prepare_database(path)  # 0600 (and so its -wal and -shm files), whatever the umask
                self._lock = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     0o600)
                self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                            timeout=BUSY_TIMEOUT)  # fmt: skip
        except (OSError, sqlite3.Error) as exc:
            if self._lock is not None:
                os.close(self._lock)
            raise JournalError(f"journal {path}: cannot open ({exc})") from None
        try:
            if checked and not readonly:  # the root checked the file's schema and made it WAL (persistent)
                self._set_synchronous(full=False)
            else:
                self._check_schema(readonly)
        except sqlite3.Error as exc:
            self.close()
            raise JournalError(f"journal {path}: cannot initialise ({exc})") from None
        except BaseException:
            self.close()
            raise

    def _check_schema(self, readonly: bool) -> None:
        try:
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version: int | None = None
            if "meta" in tables:
                row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row is not None else None
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise JournalSchemaError(f"journal {self.path}: not an agentd journal ({exc})") from None
        if tables and version is None:
            raise JournalSchemaError(f"journal {self.path}: not an agentd journal (no schema version)")
        if version is not None and version > SCHEMA_VERSION:
            raise JournalSchemaError(
                f"journal {self.path}: schema version {version} was written by a newer agentd; this one reads "
                f"up to {SCHEMA_VERSION} (upgrade agentd or use another --state-dir)"
            )
        if readonly:
            self.empty = version is None
            return
        try:
            mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(f"journal {self.path}: cannot enable WAL mode (got {mode})")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute(f"PRAGMA journal_size_limit={WAL_KEEP}")
            if version is None or version < SCHEMA_VERSION:
                with self._writing():
                    self._migrate()
        except sqlite3.Error as exc:
            self._rollback()
            raise JournalError(f"journal {self.path}: cannot initialise ({exc})") from None

    def _migrate(self) -> None:
        """Create the schema, or add what this agentd's version brought, under the write lock: the version is
        read again there, so two writers opening one new file at once create it once."""
        self.conn.execute("BEGIN IMMEDIATE")
        row = None
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        before = int(row[0]) if row is not None else 0
        if before < SCHEMA_VERSION:
            for statement in SQLITE.migration(before):
                self.conn.execute(statement)
            self.conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) ON CONFLICT (key) "
                              "DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))  # fmt: skip
        self.conn.execute("COMMIT")

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The writers' lock for one write transaction: taken within BUSY_TIMEOUT or not at all (then SQLite's
        own lock alone orders the writers); released after the transaction."""
        held = self._lock is not None and _take(self._lock)
        try:
            yield
        finally:
            if held and self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def _set_synchronous(self, *, full: bool) -> None:
        self.conn.execute("PRAGMA synchronous=FULL" if full else "PRAGMA synchronous=NORMAL")
        self._full = full

    def _transaction(self, work: Callable[[], T], *, durable: bool, what: str) -> T:
        """Run ``work`` in one write transaction (fsync'd if ``durable``); a failure rolls back whole.

        ``synchronous`` is switched only when it changes (it governs this connection's commits alone)."""
        try:
            if durable != self._full:
                self._set_synchronous(full=durable)
            held = self._lock is not None and _take(self._lock)  # the writers' lock, as _writing (inlined: hot)
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work()
                    self.conn.execute("COMMIT")
                finally:
                    self._rollback()
            finally:
                if held and self._lock is not None:
                    fcntl.flock(self._lock, fcntl.LOCK_UN)
            return result
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {what} failed ({exc})") from None

    # --- runs ---

    def append(self, run_id: str, records: Sequence[Record], durable: bool) -> int:
        [(last, error)] = self.append_group([(run_id, records, durable)])
        if error is not None:
            raise error
        assert last is not None
        return last

    def append_group(self, batches: Sequence[tuple[str, Sequence[Record], bool]]
                     ) -> list[tuple[int | None, Exception | None]]:
        """Every batch ``(run_id, records, durable)`` in one transaction (fsync'd if any is durable); each batch's
        last sequence number, or the error of a batch that could not be encoded (it alone is left out). A failing transaction raises JournalError: none of them was committed."""
        out: list[tuple[int | None, Exception | None]] = []
        encoded: list[tuple[int, str, Sequence[Record], list[tuple[str, str]]]] = []
        durable = False
        for i, (run_id, records, wants) in enumerate(batches):
            try:
                bodies = [(r.KIND, encode_json(r)) for r in records]
            except (TypeError, ValueError) as exc:
                out.append((None, JournalError(f"journal {self.path}: append failed (a record cannot be "
                                               f"encoded: {type(exc).__name__})")))
                continue
            out.append((None, None))
            encoded.append((i, run_id, records, bodies))
            durable = durable or wants

        def work() -> None:
            now = self.clock()
            for i, run_id, records, bodies in encoded:
                try:
                    out[i] = (self._append_in(run_id, records, bodies, now), None)
                except _Taken:  # that batch alone: nothing of it was written
                    out[i] = (None, JournalError(f"journal {self.path}: run {run_id!r} is already journaled"))

        if encoded:
            self._transaction(work, durable=durable, what="append")
        return out

    def _append_in(self, run_id: str, records: Sequence[Record], bodies: Sequence[tuple[str, str]], now: float
                   ) -> int:
        """The run's last sequence number (a seek to its last entry, nothing written), then the entries. The
        run's row is written only where it changes: created by the run's first batch, its status, end and
        ``next_seq`` set by its ``RunEnded``; a step in between writes no page of ``runs`` (see the module
        docstring, "Sequence numbers"). A batch with ``RunStarted`` creates the run: if the file already holds
        it, nothing is written and :class:`_Taken` is raised (a child told its run is new,
        agentd.journal.recorder, found another's)."""
        ended: RunEnded | None = None
        started: RunStarted | None = None
        for record in records:
            if isinstance(record, RunEnded):
                ended = record
            elif isinstance(record, RunStarted):
                started = record
        n = len(bodies)
        status, ended_at = ("running", None) if ended is None else (ended.status, now)
        if started is not None:
            if self.conn.execute(
                "INSERT INTO runs (run_id, status, started_at, ended_at, parent, next_seq) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO NOTHING", (run_id, status, now, ended_at, started.parent, n),
            ).rowcount == 0:
                raise _Taken(run_id)
            first = 0
        else:
            row = self.conn.execute(_LAST_SEQ, (run_id,)).fetchone()
            if row is None:  # no entry yet: the run's row is made now (or set, if an odd file holds it bare)
                self.conn.execute("INSERT INTO runs (run_id, status, started_at, ended_at, parent, next_seq) "
                                  "VALUES (?, ?, ?, ?, NULL, ?) ON CONFLICT (run_id) DO UPDATE SET "
                                  "next_seq = excluded.next_seq, status = excluded.status, ended_at = excluded.ended_at",
                                  (run_id, status, now, ended_at, n))  # fmt: skip
                first = 0
            else:
                first = int(row[0]) + 1
                if ended is not None:
                    self.conn.execute("UPDATE runs SET next_seq = ?, status = ?, ended_at = ? WHERE run_id = ?",
                                      (first + n, status, ended_at, run_id))  # fmt: skip
        self.conn.executemany(
            "INSERT INTO entries (run_id, seq, ts, kind, body) VALUES (?, ?, ?, ?, ?)",
            [(run_id, first + i, now, kind, body) for i, (kind, body) in enumerate(bodies)],
        )
        return first + n - 1

    def read_run(self, run_id: str) -> RunJournal | None:
        summary, rows = self.read_raw(run_id)
        if summary is None:
            return None
        return RunJournal(summary, tuple(Entry(seq, ts, decode(json.loads(body))) for seq, ts, _, body in rows))

    def read_raw(self, run_id: str) -> tuple[RunSummary | None, list[tuple[int, float, str, str]]]:
        """The run's summary and its rows ``(seq, ts, kind, body JSON)``, read in one snapshot."""
        if self.empty:
            return None, []
        try:
            self.conn.execute("BEGIN")
            try:
                row = self.conn.execute(f"SELECT {_SUMMARY} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                if row is None:
                    return None, []
                rows = self.conn.execute(
                    "SELECT seq, ts, kind, body FROM entries WHERE run_id = ? ORDER BY seq", (run_id,)
                ).fetchall()
            finally:
                self._rollback()
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: read failed ({exc})") from None
        return _summary(row), rows

    def _runs(self, where: str, params: tuple[Any, ...], order: str) -> list[RunSummary]:
        if self.empty:
            return []
        try:
            rows = self.conn.execute(
                f"SELECT {_SUMMARY} FROM runs {where} {order}", params
            ).fetchall()
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: read failed ({exc})") from None
        return [_summary(r) for r in rows]

    def list_runs(self, limit: int, status: str | None) -> list[RunSummary]:
        if status is None:
            return self._runs("", (), f"ORDER BY started_at DESC, run_id LIMIT {int(limit)}")
        return self._runs("WHERE status = ?", (status,), f"ORDER BY started_at DESC, run_id LIMIT {int(limit)}")

    def unfinished_runs(self) -> list[RunSummary]:
        return self._runs("WHERE ended_at IS NULL", (), "ORDER BY started_at, run_id")

    def prune(self, retention: Retention, now: float | None) -> int:
        now = self.clock() if now is None else now

        def work() -> int:
            doomed: set[str] = set()
            if retention.keep_days is not None:
                cutoff = now - retention.keep_days * 86400
                doomed.update(r[0] for r in self.conn.execute(
                    "SELECT run_id FROM runs WHERE ended_at IS NOT NULL AND ended_at < ?", (cutoff,)))  # fmt: skip
            if retention.keep_runs is not None:
                doomed.update(r[0] for r in self.conn.execute(
                    "SELECT run_id FROM runs WHERE ended_at IS NOT NULL ORDER BY ended_at DESC, run_id DESC "
                    "LIMIT -1 OFFSET ?", (retention.keep_runs,)))  # fmt: skip
            doomed -= retention.keep
            for run_id in doomed:
                self.conn.execute("DELETE FROM entries WHERE run_id = ?", (run_id,))
                self.conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            return len(doomed)

        return self._transaction(work, durable=False, what="prune")

    # --- daemon state ---

    def get_state(self, namespace: str) -> dict[str, Any]:
        if self.empty:
            return {}
        try:
            rows = self.conn.execute("SELECT key, value FROM state WHERE namespace = ?", (namespace,)).fetchall()
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: read failed ({exc})") from None
        return {key: json.loads(value) for key, value in rows}

    def put_state(self, namespace: str, changes: Mapping[str, Any]) -> None:
        encoded = {k: None if v is None else _STATE_JSON(v) for k, v in changes.items()}

        def work() -> None:
            now = self.clock()
            for key, value in encoded.items():
                if value is None:
                    self.conn.execute("DELETE FROM state WHERE namespace = ? AND key = ?", (namespace, key))
                else:
                    self.conn.execute(
                        "INSERT INTO state (namespace, key, value, updated_at) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                        "updated_at = excluded.updated_at",
                        (namespace, key, value, now),
                    )

        self._transaction(work, durable=True, what="state write")

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None


class _Job:
    """One call on the worker thread: queued, then taken (running), then done with its value or error."""

    __slots__ = ("error", "task", "value", "work")

    def __init__(self, work: Callable[[], Any], task: trio.lowlevel.Task) -> None:
        self.work, self.task = work, task
        self.value: Any = None
        self.error: BaseException | None = None


class Worker:
    """The journal's own thread: every call on the connection, one at a time, in the order they came.

    Why not ``trio.to_thread.run_sync`` with a ``CapacityLimiter(1)``: the same contract (one thread at a time
    on the connection; a call is cancellable while it waits its turn, never once it runs) at about half its
    CPU per call on the trio thread, which a step's commit pays once and a journaled child's run about six
    times. The thread is one of trio's (``start_thread_soon``) running this worker's loop until
    :meth:`stop`; a caller parks its task, the thread runs the call and reschedules it through the run's
    token. A queued call is either taken by the thread or withdrawn by its cancelled caller: whoever first
    removes it from ``_queued`` (one ``dict.pop``: atomic in CPython)."""

    def __init__(self, *, thread: bool = True) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._queued: dict[_Job, None] = {}
        #: False: every call runs on the trio thread itself (the fork server's rehearsal, where no thread may be
        #: left running at a fork).
        self._threaded = thread
        if thread:
            trio.lowlevel.start_thread_soon(self._serve, lambda _: None, name="agentd-journal")

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._queued.pop(job, False) is False:
                continue  # withdrawn
            try:
                job.value = job.work()
            except BaseException as exc:  # handed to the caller, raised there
                job.error = exc
            self._token.run_sync_soon(trio.lowlevel.reschedule, job.task)

    async def call(self, work: Callable[[], T]) -> T:
        if not self._threaded:
            await trio.lowlevel.checkpoint()
            return work()
        await trio.lowlevel.checkpoint_if_cancelled()
        job = _Job(work, trio.lowlevel.current_task())

        def abort(_: Any) -> trio.lowlevel.Abort:
            if self._queued.pop(job, False) is False:
                return trio.lowlevel.Abort.FAILED  # running: its outcome is waited for
            return trio.lowlevel.Abort.SUCCEEDED

        self._queued[job] = None
        self._jobs.put(job)
        await trio.lowlevel.wait_task_rescheduled(abort)
        if job.error is not None:
            raise job.error
        return cast(T, job.value)

    def stop(self) -> None:
        """The thread ends after the calls queued before this one (and goes back to trio's cache)."""
        if self._threaded:
            self._jobs.put(None)


@attrs.define(eq=False)
class SqliteJournal:
    """:class:`~agentd.journal.store.JournalStore` on one SQLite file. Use :func:`open_journal`."""

    _file: JournalFile
    _worker: Worker
    _leases: dict[str, Lease] = attrs.field(factory=dict)
    _token: int = 0
    #: Known secret values (the log's): scrubbed out of every record and state value before it is written.
    redactor: Redactor | None = None
    #: Every append goes through it (group commit, agentd.journal.group).
    writer: GroupCommit[tuple[str, Sequence[Record], bool], int] = attrs.field(init=False)

    @writer.default
    def _writer(self) -> GroupCommit[tuple[str, Sequence[Record], bool], int]:
        return GroupCommit(self._flush)

    @property
    def path(self) -> str:
        return self._file.path

    async def _call(self, work: Callable[[], T]) -> T:
        return await self._worker.call(work)

    async def append(self, run_id: str, records: Sequence[Record], *, durable: bool = False) -> int:
        if not records:
            raise ValueError("append needs at least one record")
        batch = tuple(records) if self.redactor is None else tuple(redacted(r, self.redactor) for r in records)
        return await self.writer.submit((run_id, batch, durable))

    async def _flush(self, group: Sequence[Pending[tuple[str, Sequence[Record], bool], int]]) -> None:
        batches = [p.batch for p in group]
        for pending, (last, error) in zip(group, await self._call(lambda: self._file.append_group(batches)),
                                          strict=True):
            pending.settle(last, error)

    async def read_run(self, run_id: str) -> RunJournal | None:
        return await self._call(lambda: self._file.read_run(run_id))

    async def list_runs(self, *, limit: int = 50, status: str | None = None) -> list[RunSummary]:
        return await self._call(lambda: self._file.list_runs(limit, status))

    async def unfinished_runs(self) -> list[RunSummary]:
        return await self._call(self._file.unfinished_runs)

    async def get_state(self, namespace: str) -> dict[str, Any]:
        return await self._call(lambda: self._file.get_state(namespace))

    async def put_state(self, namespace: str, changes: Mapping[str, Any]) -> None:
        scrub = self.redactor.scrub_value if self.redactor is not None else None
        snapshot = {k: v if scrub is None or v is None else scrub(v) for k, v in changes.items()}
        await self._call(lambda: self._file.put_state(namespace, snapshot))

    async def prune(self, retention: Retention, *, now: float | None = None) -> int:
        return await self._call(lambda: self._file.prune(retention, now))

    async def claim(self, run_id: str, owner: str, *, ttl: float) -> Lease | None:
        now = self._file.clock()
        held = self._leases.get(run_id)
        if held is not None and held.owner != owner and held.expires_at > now:
            return None
        self._token += 1
        lease = Lease(run_id, owner, self._token, now + ttl)
        self._leases[run_id] = lease
        return lease

    async def renew(self, lease: Lease, *, ttl: float) -> Lease | None:
        if self._leases.get(lease.run_id) != lease:
            return None
        renewed = attrs.evolve(lease, expires_at=self._file.clock() + ttl)
        self._leases[lease.run_id] = renewed
        return renewed

    async def release(self, lease: Lease) -> None:
        if self._leases.get(lease.run_id) == lease:
            del self._leases[lease.run_id]

    async def aclose(self) -> None:
        try:
            with trio.move_on_after(CLOSE_GRACE, shield=True):
                await self._call(self._file.close)
        finally:
            self._worker.stop()


@asynccontextmanager
async def open_journal(state_dir: str, *, clock: Callable[[], float] = time.time,
                       redactor: Redactor | None = None, checked: bool = False) -> AsyncIterator[SqliteJournal]:
    """Open (creating) ``<state_dir>/journal.sqlite3``; closed, shielded and bounded, on exit. ``redactor``'s
    secret values are never written. ``checked``: another process of the tree (the root) opened the file and
    checked its schema: this one does not again (a tree's child)."""
    path = db_path(state_dir)
    worker = Worker()
    try:
        file = await worker.call(lambda: JournalFile(path, clock=clock, checked=checked))
    except BaseException:
        worker.stop()
        raise
    journal = SqliteJournal(file, worker, redactor=redactor)
    try:
        yield journal
    finally:
        await journal.aclose()


if TYPE_CHECKING:

    def _implements_the_interface(journal: SqliteJournal) -> JournalStore:
        return journal  # mypy checks SqliteJournal against the JournalStore protocol here
