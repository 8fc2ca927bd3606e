"""The SQLite journal on real files: schema refusal, a blocked disk, a private state directory, which commits are fsynced (the store
contract both backends share is tests/journal/test_store_contract.py)."""

from __future__ import annotations

import sqlite3

import pytest
import trio

from agentd.journal.errors import JournalSchemaError
from agentd.journal.recorder import RunRecorder
from agentd.journal.records import RunEnded, RunStarted
from agentd.journal.sqlite import DB_NAME, SCHEMA_VERSION, open_journal
from tests.journal.helpers import step


async def test_newer_schema_is_refused_untouched(tmp_path):
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r1", [RunStarted("d", "go")])
    db = tmp_path / DB_NAME
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(JournalSchemaError, match=f"schema version {SCHEMA_VERSION + 1} was written by a newer"):
        async with open_journal(str(tmp_path)):
            pass
    assert db.read_bytes() == before


async def test_foreign_database_and_garbage_are_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    conn = sqlite3.connect(foreign / DB_NAME)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(JournalSchemaError, match="not an agentd journal"):
        async with open_journal(str(foreign)):
            pass
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / DB_NAME).write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(JournalSchemaError, match="not an agentd journal"):
        async with open_journal(str(garbage)):
            pass


async def test_a_blocked_disk_never_blocks_the_event_loop(tmp_path):
    """Another connection holds the write lock (as a stalled disk would hold a commit): the append waits on
    the worker thread while trio keeps scheduling; it commits once the lock is released."""
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
        blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        done = trio.Event()
        seq: list[int] = []

        async def append() -> None:
            seq.append(await journal.append("r", step(0)))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append)
            ticks = 0
            for _ in range(50):
                await trio.sleep(0.002)  # real time: the loop runs on while SQLite's lock holds the append off
                ticks += 1
            assert ticks == 50 and not done.is_set()
            blocker.execute("COMMIT")
            blocker.close()
            with trio.fail_after(10):
                await done.wait()
        assert seq == [4]


async def test_a_created_state_dir_is_private(tmp_path):
    state = tmp_path / "new" / "state"
    async with open_journal(str(state)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
    assert (state.stat().st_mode & 0o777) == 0o700


async def test_a_step_with_tool_calls_and_the_run_end_are_fsynced_and_the_rest_is_not(tmp_path):
    """``synchronous=FULL`` (the WAL fsync'd before the commit returns, which secures every earlier commit
    too) for what agentd acts on outside the journal: a step that asks for tool calls (before they are sent)
    and the run's end (before its result is handed out); the rest is secured by the next of those
    (docs/durability.md, "fsync policy"). A trigger notes the connection's setting each row was written under."""
    async with open_journal(str(tmp_path)):
        pass  # the schema
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        conn.execute("CREATE TABLE seen (kind TEXT, sync INTEGER)")
        conn.execute("CREATE TRIGGER note AFTER INSERT ON entries BEGIN "
                     "INSERT INTO seen SELECT new.kind, synchronous FROM pragma_synchronous; END")
    async with open_journal(str(tmp_path)) as journal:
        recorder = RunRecorder(journal, "r")
        await recorder.started(RunStarted("d", "charge it"))
        await recorder.replied(1, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "pay__charge", "arguments": "{}"}}]}, 10, 5)
        await recorder.observed(1, "c1", True, "charged")
        await recorder.spawned(2, "0.1", "look it up", None)
        await recorder.child_ended("0.1", "completed", "found")
        await recorder.replied(3, {"role": "assistant", "content": "done"}, 10, 5)
        await recorder.ended("completed", {"result": "done"}, None)
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        seen = conn.execute("SELECT kind, sync FROM seen ORDER BY rowid").fetchall()
    full, normal = 2, 1
    assert [k for k, _ in seen] == ["run.started", "model.reply", "tool.requested", "usage", "tool.outcome", "spawn",
                                    "child.result", "model.reply", "usage", "run.ended"]
    assert [s for _, s in seen] == [normal, full, full, full, normal, normal, normal, normal, normal, full]


def _runs(path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]


async def test_writers_take_turns_on_the_lock_file_and_go_on_without_it_after_the_busy_timeout(tmp_path, monkeypatch):
    """Every write transaction first takes the flock of ``journal.sqlite3-lock`` (another process holding it: the
    writer waits for it), bounded: after the busy timeout the writer commits under SQLite's own lock alone."""
    import fcntl
    import os

    from agentd.journal import sqlite as store

    async with open_journal(str(tmp_path)) as journal:
        lock = os.open(tmp_path / (DB_NAME + store.LOCK_SUFFIX), os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another writer (an open file description of its own) holds it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(journal.append, "waits", [RunStarted("d", "go")])
                await trio.sleep(0.3)  # real time: the append waits on a real file lock, not on trio's clock
                assert _runs(tmp_path / DB_NAME) == []  # not committed while the lock is held
                fcntl.flock(lock, fcntl.LOCK_UN)
            assert _runs(tmp_path / DB_NAME) == ["waits"]

            monkeypatch.setattr(store, "BUSY_TIMEOUT", 0.05)
            fcntl.flock(lock, fcntl.LOCK_EX)
            with trio.fail_after(30):
                await journal.append("goes_on", [RunStarted("d", "go")])
            assert _runs(tmp_path / DB_NAME) == ["goes_on", "waits"]
        finally:
            os.close(lock)


def _wal(path) -> tuple[int, int]:
    """The WAL's size and its header's checkpoint counter (one more each time it is started again from its
    beginning after a checkpoint)."""
    wal = path.parent / (path.name + "-wal")
    with open(wal, "rb") as f:
        head = f.read(16)
    return wal.stat().st_size, int.from_bytes(head[12:16], "big")


async def _append_until_restarted(journal, path, restarts: int, sizes: list[int]) -> None:
    n = 0
    while (seen := _wal(path))[1] < restarts:
        sizes.append(seen[0])
        await journal.append("r", step(n))
        n += 1
        assert n < 20_000, "the WAL was never started again"
    sizes.append(_wal(path)[0])


async def test_the_wal_is_written_again_in_place_after_a_checkpoint_not_grown_or_cut(tmp_path):
    """After a checkpoint the next commit writes the WAL again from its start, in the file as it is: commits
    then overwrite (a durable commit's fdatasync has no file size to commit) and the file keeps its size."""
    path = tmp_path / DB_NAME
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
        first: list[int] = []
        await _append_until_restarted(journal, path, 1, first)  # the first checkpoint: the WAL grew to here
        grown = max(first)
        after: list[int] = []
        await _append_until_restarted(journal, path, 3, after)  # two more rounds, written in place
    assert grown > 512 * 1024  # a WAL's worth of steps, not a few commits
    assert min(after) >= grown  # never cut
    assert max(after) <= grown * 1.1  # reused: at most a commit's frames beyond the first round's end


async def test_a_wal_larger_than_its_bound_is_cut_back_when_it_starts_again(tmp_path, monkeypatch):
    from agentd.journal import sqlite as store

    monkeypatch.setattr(store, "WAL_KEEP", 64 * 1024)
    path = tmp_path / DB_NAME
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
        sizes: list[int] = []
        await _append_until_restarted(journal, path, 2, sizes)
    assert max(sizes) > 512 * 1024 and sizes[-1] < max(sizes) // 2


async def test_a_step_writes_no_page_of_runs_and_the_records_are_counted_from_the_entries(tmp_path):
    """A run's row is written by its first batch and by its end; a step in between only adds entries (its
    sequence numbers follow the run's last entry), and a running run's record count is read from them."""
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        conn.execute("CREATE TABLE run_writes (run_id TEXT, next_seq INTEGER)")
        conn.execute("CREATE TRIGGER note AFTER UPDATE ON runs BEGIN "
                     "INSERT INTO run_writes VALUES (new.run_id, new.next_seq); END")
    async with open_journal(str(tmp_path)) as journal:
        assert await journal.append("r", step(1)) == 4
        assert await journal.append("r", step(2), durable=True) == 8
        running = await journal.read_run("r")
        assert [s.records for s in await journal.unfinished_runs()] == [9]
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        assert conn.execute("SELECT * FROM run_writes").fetchall() == []
        assert conn.execute("SELECT next_seq FROM runs").fetchall() == [(1,)]  # as its first batch left it
    async with open_journal(str(tmp_path)) as journal:  # a new process goes on after the last entry
        assert await journal.append("r", [RunEnded("completed", "ok")]) == 9
        ended = await journal.read_run("r")
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        assert conn.execute("SELECT * FROM run_writes").fetchall() == [("r", 10)]  # the end: exact for any reader
    assert running is not None and running.summary.records == 9
    assert [e.seq for e in running.entries] == list(range(9))
    assert ended is not None and ended.summary.records == 10 and ended.summary.status == "completed"
    assert [e.seq for e in ended.entries] == list(range(10))
