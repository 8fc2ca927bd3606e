"""The durable transcript: each run's messages, tool arguments and results in an embedded SQLite store.

Why a thread: ``sqlite3`` is blocking I/O and there is no trio-native SQLite. Every database operation runs
in ``trio.to_thread.run_sync`` under a ``CapacityLimiter(1)``, so exactly one worker thread touches the
connection at a time and the trio loop never blocks on disk. This is the one reviewed use of threads in
agentd/ (docs/connections.md).

Durability: the store is in WAL mode. Entries are queued by the run (synchronously, from the loop's hooks)
and committed by a writer task as they come, so a killed process loses nothing already committed (the
WAL is in the OS page cache). At each step boundary the boundary row is committed with
``synchronous=FULL``, which fsyncs the WAL: a step's record survives a power loss once the next step
starts. Cancellation drains the queue shielded and bounded.

Data policy (host ``transcript.dataPolicy``): ``full`` keeps everything; ``redact_tool_values`` replaces
tool arguments and results by ``"[redacted]"`` (model text and prompts stay); ``metadata_only`` keeps ids,
names, kinds, sizes and timings, never a value. Retention (``retentionDays``, 0 = keep forever) deletes
older runs when a store is opened.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import trio

from agentd.errors import ConfigError
from agentd.telemetry.events import EventLog
from agentd.telemetry.private_files import prepare_database

REDACTED: Final = "[redacted]"
#: Bound on draining the queue when the run is cancelled.
FLUSH_GRACE: Final = 5.0

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started_at REAL NOT NULL, ended_at REAL, status TEXT NOT NULL,
    manifest TEXT, policy TEXT NOT NULL, result TEXT
);
CREATE TABLE IF NOT EXISTS entries (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, step TEXT, kind TEXT NOT NULL,
    role TEXT, name TEXT, call_id TEXT, size INTEGER, content TEXT,
    PRIMARY KEY (run_id, seq)
);
"""


def default_path(env: Mapping[str, str]) -> str:
    state = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "agentd", "transcripts.sqlite3")


@attrs.frozen
class Entry:
    step: str | None
    kind: str  # step.start | model.reply | tool.result | step.end
    role: str | None = None
    name: str | None = None
    call_id: str | None = None
    content: Any = None
    tool_value: bool = False  # content is a tool argument or result (redacted by redact_tool_values)
    boundary: bool = False  # commit with fsync
    ts: float = attrs.field(factory=time.time)


def _apply_policy(entry: Entry, policy: str) -> tuple[int | None, str | None]:
    if entry.content is None:
        return None, None
    text = entry.content if isinstance(entry.content, str) else json.dumps(entry.content, default=str)
    if policy == "metadata_only":
        return len(text), None
    if policy == "redact_tool_values":
        if entry.tool_value:
            return len(text), json.dumps(REDACTED)
        if isinstance(entry.content, Mapping) and "tool_calls" in entry.content:
            redacted = dict(entry.content)
            redacted["tool_calls"] = [{**call, "arguments": REDACTED} for call in entry.content["tool_calls"]]
            return len(text), json.dumps(redacted, default=str)
    return len(text), json.dumps(entry.content, default=str)


class _Db:
    """The connection, touched only from the limiter's single worker thread."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)  # as the journal's
        prepare_database(path)  # 0600 (and so its -wal and -shm files), whatever the umask
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)

    def retention(self, days: int) -> int:
        if days <= 0:
            return 0
        cutoff = time.time() - days * 86400
        with self.conn:
            old = [r[0] for r in self.conn.execute("SELECT run_id FROM runs WHERE started_at < ?", (cutoff,))]
            for run_id in old:
                self.conn.execute("DELETE FROM entries WHERE run_id = ?", (run_id,))
                self.conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
        return len(old)

    def begin(self, run_id: str, manifest: str | None, policy: str) -> None:
        self.conn.execute("BEGIN")
        self.conn.execute(
            "INSERT OR REPLACE INTO runs (run_id, started_at, status, manifest, policy) VALUES (?, ?, 'running', ?, ?)",
            (run_id, time.time(), manifest, policy),
        )
        self.conn.execute("DELETE FROM entries WHERE run_id = ?", (run_id,))
        self.conn.execute("COMMIT")

    def write(self, run_id: str, first_seq: int, entries: list[Entry], policy: str) -> None:
        boundary = any(e.boundary for e in entries)
        if boundary:
            self.conn.execute("PRAGMA synchronous=FULL")
        try:
            self.conn.execute("BEGIN")
            for offset, entry in enumerate(entries):
                size, content = _apply_policy(entry, policy)
                self.conn.execute(
                    "INSERT INTO entries (run_id, seq, ts, step, kind, role, name, call_id, size, content) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, first_seq + offset, entry.ts, entry.step, entry.kind, entry.role, entry.name,
                     entry.call_id, size, content),
                )  # fmt: skip
            self.conn.execute("COMMIT")
        finally:
            if boundary:
                self.conn.execute("PRAGMA synchronous=NORMAL")

    def end(self, run_id: str, status: str, result: str | None) -> None:
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("UPDATE runs SET ended_at = ?, status = ?, result = ? WHERE run_id = ?",
                          (time.time(), status, result, run_id))  # fmt: skip
        self.conn.execute("PRAGMA synchronous=NORMAL")

    def close(self) -> None:
        self.conn.close()


@attrs.define(eq=False)
class Transcript:
    """One run's writer. Use :func:`open_transcript`; :meth:`record` is synchronous (called from hooks)."""

    run_id: str
    policy: str
    log: EventLog
    _db: _Db
    _limiter: trio.CapacityLimiter
    _send: trio.MemorySendChannel[Entry]
    _receive: trio.MemoryReceiveChannel[Entry]
    _seq: int = 0
    _idle: trio.Event = attrs.field(factory=trio.Event)
    _pending: int = 0

    def record(self, entry: Entry) -> None:
        # A server may echo a credential back (a header in a tool result): registered values never land here.
        entry = attrs.evolve(entry, content=self.log.redactor.scrub_value(entry.content))
        self._pending += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._send.send_nowait(entry)

    async def flush(self) -> None:
        """Wait until everything recorded so far is committed."""
        while self._pending:
            await self._idle.wait()

    async def _run(self, db_call: Any) -> Any:
        return await trio.to_thread.run_sync(db_call, limiter=self._limiter)

    async def writer(self) -> None:
        while True:
            batch = [await self._receive.receive()]
            while True:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            await self._write(batch)

    async def _write(self, batch: list[Entry]) -> None:
        first = self._seq
        self._seq += len(batch)
        await self._run(lambda: self._db.write(self.run_id, first, batch, self.policy))
        self._pending -= len(batch)
        if self._pending == 0:
            self._idle.set()
        self.log.debug("transcript.write", entries=len(batch), boundary=any(e.boundary for e in batch))

    async def drain(self) -> None:
        """Commit whatever is still queued (used when the writer task is being torn down)."""
        batch: list[Entry] = []
        while True:
            try:
                batch.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                break
        if batch:
            await self._write(batch)

    async def abort(self, status: str) -> None:
        """Cancelled: commit what is queued and mark the run (the caller shields and bounds this)."""
        await self.drain()
        await self._run(lambda: self._db.end(self.run_id, status, None))

    async def end(self, status: str, result: Any) -> None:
        await self.flush()
        result = self.log.redactor.scrub_value(result)
        text = None if self.policy == "metadata_only" or result is None else json.dumps(result, default=str)
        await self._run(lambda: self._db.end(self.run_id, status, text))


@asynccontextmanager
async def open_transcript(
    path: str, *, run_id: str, policy: str, retention_days: int, manifest: str | None, log: EventLog
) -> AsyncIterator[Transcript]:
    """Open the store (creating it), apply retention, start the run's record and its writer task."""
    limiter = trio.CapacityLimiter(1)
    try:
        db = await trio.to_thread.run_sync(_Db, path, limiter=limiter)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(f"transcript store {path}: cannot open ({exc})") from None
    send, receive = trio.open_memory_channel[Entry](math.inf)
    transcript = Transcript(run_id, policy, log, db, limiter, send, receive)
    transcript._idle.set()
    try:
        removed = await trio.to_thread.run_sync(db.retention, retention_days, limiter=limiter)
        await trio.to_thread.run_sync(db.begin, run_id, manifest, policy, limiter=limiter)
        log.info("transcript.write", path=path, policy=policy, retention_removed=removed, entries=0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(transcript.writer)
            try:
                yield transcript
            finally:
                with trio.move_on_after(FLUSH_GRACE, shield=True):
                    await transcript.drain()
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(FLUSH_GRACE, shield=True):
            await trio.to_thread.run_sync(db.close, limiter=limiter)


# --- reading ---------------------------------------------------------------------------------------------


def read_run(path: str, run_id: str) -> dict[str, Any] | None:
    """One run and its entries as JSON-ready data (blocking: the CLI's ``transcript show``)."""
    if not os.path.exists(path):
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        run = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if run is None:
            return None
        rows = conn.execute("SELECT * FROM entries WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
    finally:
        conn.close()
    doc = dict(run)
    doc["result"] = json.loads(doc["result"]) if doc["result"] is not None else None
    doc["entries"] = [
        {**{k: row[k] for k in row.keys() if k not in ("run_id", "content")},  # noqa: SIM118 - Row iterates values
         "content": json.loads(row["content"]) if row["content"] is not None else None}
        for row in rows
    ]  # fmt: skip
    return doc


def list_runs(path: str, limit: int = 50) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT run_id, started_at, ended_at, status, policy FROM runs ORDER BY started_at DESC LIMIT ?",
            (limit,),
        ).fetchall()
    finally:
        conn.close()
    return [dict(r) for r in rows]
