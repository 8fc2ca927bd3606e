"""The journal schema's one declaration and its two renderings, on a real SQLite file and a real PostgreSQL.

- Both stores, read back from the database itself, hold exactly what the declaration says, and the tables they
  share are the same (columns, types, nullability, defaults, keys, indexes).
- A database the released agentd created (tests/journal/released_schemas.py, verbatim) opens with this one,
  keeps its rows, and ends up with the schema a fresh database has.
- A later version's additions (a table, columns, an index) migrate an existing database of both dialects to
  what a fresh one of that version is.
"""

from __future__ import annotations

import os
import sqlite3

import attrs
import psycopg
import pytest

from agentd.cluster import migrations
from agentd.cluster.store import open_database, open_pg_journal
from agentd.journal.ddl import POSTGRES, SQLITE, Dialect
from agentd.journal.records import RunEnded, RunStarted, Usage, encode_json
from agentd.journal.schema import SCHEMA, Column, Counter, Index, Schema, Table
from agentd.journal.sqlite import DB_NAME, open_journal
from tests.journal import released_schemas
from tests.journal.readback import normal, read_postgres, read_sqlite
from tests.postgres import PASSWORD


def _sqlite_file(tmp_path: object, statements: list[str] | tuple[str, ...], version: int) -> str:
    path = os.path.join(str(tmp_path), DB_NAME)
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        conn.execute(statement)
    conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(version),))
    conn.close()
    return path


def _pg(dsn: str, statements: list[str] | tuple[str, ...] = ()) -> psycopg.Connection:
    conn = psycopg.connect(dsn, password=PASSWORD, autocommit=True)
    for statement in statements:
        conn.execute(statement.encode())
    return conn


def _shared(schema: Schema) -> Schema:
    names = {t.name for t in SCHEMA.tables if t.scope == "journal"}
    return normal(Schema(tuple(t for t in schema.tables if t.name in names)), key_ordered=False)


async def test_both_stores_hold_the_declaration_and_agree_on_the_journal(tmp_path, pg_dsn):
    async with open_journal(str(tmp_path)) as journal:
        await journal.append("r", [RunStarted("d", "go")])
    db = await open_database(pg_dsn, PASSWORD, "x", migrate=False)
    await db.aclose()
    on_sqlite = read_sqlite(os.path.join(str(tmp_path), DB_NAME), SQLITE)
    with _pg(pg_dsn) as conn:
        on_postgres = read_postgres(conn, POSTGRES)
    assert on_sqlite == normal(SQLITE.holds)
    assert on_postgres == normal(POSTGRES.holds, key_ordered=False)
    assert _shared(on_sqlite) == _shared(on_postgres)
    assert {t.name for t in _shared(on_sqlite).tables} == {"meta", "runs", "entries", "state"}
    # the journal's tables are all of the SQLite file; the cluster's are PostgreSQL's alone
    assert [t.name for t in on_sqlite.tables] == sorted(t.name for t in SCHEMA.tables if t.scope == "journal")
    assert on_postgres.counters == (Counter("fence", "journal"),)


async def test_a_journal_file_of_the_released_agentd_opens_and_keeps_its_runs(tmp_path):
    path = _sqlite_file(tmp_path, released_schemas.statements(released_schemas.SQLITE_V1), 1)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO runs VALUES ('old', 'completed', 1.0, 2.0, NULL, 1)")
    conn.execute("INSERT INTO entries VALUES ('old', 0, 1.0, 'run.ended', '{\"status\":\"completed\"}')")
    conn.execute("INSERT INTO state VALUES ('ns', 'k', '{\"a\":1}', 1.0)")
    conn.close()
    async with open_journal(str(tmp_path)) as journal:
        assert await journal.get_state("ns") == {"k": {"a": 1}}
        old = await journal.list_runs()
        await journal.append("new", [RunStarted("d", "go"), RunEnded("completed", "ok")])
        new = await journal.read_run("new")
    assert [r.run_id for r in old] == ["old"]
    assert new is not None and new.summary.status == "completed"
    assert read_sqlite(path, SQLITE) == normal(SQLITE.holds)


async def test_a_running_run_of_the_released_agentd_goes_on_after_its_last_entry(tmp_path):
    """The released agentd counted a run's records in its row at every append; this one numbers a batch from
    the run's last entry: a run it left running goes on where it was, and is counted the same."""
    path = _sqlite_file(tmp_path, released_schemas.statements(released_schemas.SQLITE_V1), 1)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO runs VALUES ('old', 'running', 1.0, NULL, NULL, 2)")
    for seq, record in enumerate([RunStarted("d", "go"), Usage(1, 1, 1)]):
        conn.execute("INSERT INTO entries VALUES ('old', ?, 1.0, ?, ?)", (seq, record.KIND, encode_json(record)))
    conn.close()
    async with open_journal(str(tmp_path)) as journal:
        [before] = await journal.unfinished_runs()
        assert await journal.append("old", [RunEnded("completed", "ok")]) == 2
        run = await journal.read_run("old")
    assert before.records == 2
    assert run is not None and run.summary.records == 3 and run.summary.status == "completed"
    assert [(e.seq, e.record.KIND) for e in run.entries][-1] == (2, "run.ended")


async def test_a_cluster_database_of_the_released_agentd_opens_and_migrates(pg_server):
    current = str(pg_server.dsn(pg_server.new_database()))
    with _pg(current, released_schemas.statements(released_schemas.POSTGRES_V1 + released_schemas.POSTGRES_V2)) as c:
        c.execute("INSERT INTO agentd_meta (key, value) VALUES ('schema_version', '2')")
    async with open_pg_journal(current, PASSWORD) as journal:  # the same version: no migration needed
        await journal.append("r", [RunStarted("d", "go")])
        assert [r.run_id for r in await journal.unfinished_runs()] == ["r"]
    older = str(pg_server.dsn(pg_server.new_database()))
    with _pg(older, released_schemas.statements(released_schemas.POSTGRES_V1)) as c:
        c.execute("INSERT INTO agentd_meta (key, value) VALUES ('schema_version', '1')")
        c.execute("INSERT INTO agentd_work (work_id, kind, payload, created_at, not_before) "
                  "VALUES ('kept', 'spawn', '{}', 0, 0)")
    db = await open_database(older, PASSWORD, "x", migrate=True)
    await db.aclose()
    fresh = normal(POSTGRES.holds, key_ordered=False)
    for dsn in (current, older):
        with _pg(dsn) as conn:
            assert read_postgres(conn, POSTGRES) == fresh
            assert migrations.current_version(conn) == POSTGRES.version
    with _pg(older) as conn:
        assert conn.execute("SELECT work_id, status, attempts, cancel_requested FROM agentd_work").fetchall() == [
            ("kept", "open", 0, False)]


#: The declaration as a later agentd might extend it: a new journal table, columns added to released tables
#: (one nullable, one with a default of each kind), and an index on a released table.
LATER = Schema(
    tables=(
        *(attrs.evolve(t, columns=(*t.columns, Column("note", "text", nullable=True, since=3)))
          if t.name == "runs" else
          attrs.evolve(t, columns=(*t.columns, Column("flagged", "boolean", default=True, since=3),
                                   Column("label", "text", default="it's", since=3),
                                   Column("weight", "bigint", default=7, since=3)),
                       indexes=(*t.indexes, Index("entries_kind", ("kind", "ts"), since=3)))
          if t.name == "entries" else t
          for t in SCHEMA.tables),
        Table("notes", (Column("id", "text", since=3), Column("at", "real", since=3)), key=("id",),
              indexes=(Index("notes_at", ("at",), where="at IS NOT NULL", since=3),), key_ordered=True, since=3),
    ),
    counters=SCHEMA.counters,
)


@pytest.mark.parametrize("base", [SQLITE, POSTGRES], ids=["sqlite", "postgres"])
def test_a_later_version_migrates_to_what_a_fresh_database_of_it_is(base: Dialect, tmp_path, pg_server):
    later = attrs.evolve(base, schema=LATER)
    assert later.version == 3
    assert not any(s.startswith("CREATE TABLE") and "runs" in s for s in later.migration(base.version))
    if base is SQLITE:
        os.makedirs(tmp_path / "a")
        migrated = _sqlite_file(tmp_path / "a", base.migration(0), base.version)
        conn = sqlite3.connect(migrated, isolation_level=None)
        for statement in later.migration(base.version):
            conn.execute(statement)
        conn.close()
        os.makedirs(tmp_path / "b")
        fresh = _sqlite_file(tmp_path / "b", later.migration(0), later.version)
        assert read_sqlite(migrated, later) == read_sqlite(fresh, later) == normal(later.holds)
        return
    migrated_dsn, fresh_dsn = (str(pg_server.dsn(pg_server.new_database())) for _ in range(2))
    with _pg(migrated_dsn, base.migration(0)) as conn:
        for statement in later.migration(base.version):
            conn.execute(statement.encode())
        on_migrated = read_postgres(conn, later)
    with _pg(fresh_dsn, later.migration(0)) as conn:
        on_fresh = read_postgres(conn, later)
    assert on_migrated == on_fresh == normal(later.holds, key_ordered=False)


@pytest.mark.parametrize(("table", "reason"), [
    (lambda: Table("t", (Column("a", "text"), Column("b", "text", since=2)), key=("a",)), "needs a default"),
    (lambda: Table("t", (Column("a", "text"), Column("b", "text", since=2, nullable=True), Column("c", "text")),
                   key=("a",)), "add it last"),
    (lambda: Table("t", (Column("a", "text", nullable=True),), key=("a",)), "key column a must be NOT NULL"),
    (lambda: Table("t", (Column("a", "text"),), key=("b",)), "names no declared column"),
    (lambda: Table("t", (Column("a", "text"),), key=("a",), indexes=(Index("i", ("z",)),)), "unknown column"),
])
def test_a_declaration_that_could_not_migrate_is_refused(table, reason):
    with pytest.raises(ValueError, match=reason):
        table()


def test_sqlite_cannot_be_given_a_sequence():
    shared_counter = Schema(SCHEMA.tables, (Counter("fence", "journal"),))
    with pytest.raises(ValueError, match="sqlite has no sequences, yet holds fence"):
        attrs.evolve(SQLITE, schema=shared_counter).migration(0)
