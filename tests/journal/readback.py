"""A real database's schema read back as the declaration's values (agentd.journal.schema), to compare with it.

SQLite from ``sqlite_master`` and its pragmas; PostgreSQL from ``information_schema`` (tables, columns, keys,
sequences) and ``pg_index`` (indexes, which information_schema does not describe). What a dialect cannot say is
normalised on both sides by :func:`normal`: versions, scopes, the spelling of an index predicate, and (for
PostgreSQL) whether a table is key-ordered.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

import attrs

from agentd.journal.ddl import Dialect
from agentd.journal.schema import Column, ColumnType, Counter, Index, Schema, Table


def _type(dialect: Dialect, name: str) -> ColumnType:
    by_name = {sql.lower(): portable for portable, sql in dialect.types.items()}
    return by_name[name.lower()]


def _default(text: str | None, kind: ColumnType) -> str | int | bool | None:
    if text is None:
        return None
    text = re.sub(r"::[\w ]+$", "", text.strip())
    if text.startswith("'"):
        return text[1:-1].replace("''", "'")
    if kind == "boolean":
        return text.lower() in ("true", "1")
    return int(text)


def predicate(text: str | None) -> str | None:
    """One spelling of an index predicate: no casts, no parentheses, lower case, single spaces."""
    if text is None:
        return None
    text = re.sub(r"::\w+", "", text).replace("(", " ").replace(")", " ")
    return " ".join(text.lower().split())


def normal(schema: Schema, *, key_ordered: bool = True) -> Schema:
    """``schema`` without what a database does not record: every ``since`` 1, every scope ``journal``,
    predicates in one spelling, names sorted (and ``key_ordered`` dropped unless the dialect keeps it)."""
    tables = []
    for t in sorted(schema.tables, key=lambda t: t.name):
        columns = tuple(attrs.evolve(c, since=1) for c in t.columns)
        indexes = tuple(sorted((Index(i.name, i.columns, predicate(i.where)) for i in t.indexes),
                               key=lambda i: i.name))  # fmt: skip
        tables.append(Table(t.name, columns, t.key, indexes, key_ordered=key_ordered and t.key_ordered))
    return Schema(tuple(tables), tuple(sorted((Counter(c.name, "journal") for c in schema.counters),
                                              key=lambda c: c.name)))  # fmt: skip


def unprefixed(name: str, prefix: str) -> str:
    assert name.startswith(prefix), f"{name!r} lacks the prefix {prefix!r}"
    return name[len(prefix):]


def read_sqlite(path: str, dialect: Dialect) -> Schema:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = []
        for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                                      "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall():  # fmt: skip
            info = conn.execute(f"PRAGMA table_info({name})").fetchall()
            columns = tuple(Column(cname, _type(dialect, ctype), nullable=not notnull and not pk,
                                   default=_default(dflt, _type(dialect, ctype)))
                            for _, cname, ctype, notnull, dflt, pk in info)  # fmt: skip
            key = tuple(cname for *_, cname in sorted((pk, cname) for _, cname, _, _, _, pk in info if pk))
            indexes = []
            for _, iname, _unique, origin, _partial in conn.execute(f"PRAGMA index_list({name})").fetchall():
                if origin != "c":  # the key's own index
                    continue
                cols = tuple(r[2] for r in sorted(conn.execute(f"PRAGMA index_info({iname})").fetchall()))
                (isql,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?",
                                       (iname,)).fetchone()  # fmt: skip
                where = re.search(r"\bWHERE\b(.*)$", isql, re.I | re.S)
                indexes.append(Index(unprefixed(iname, dialect.prefix), cols,
                                     where.group(1).strip() if where else None))  # fmt: skip
            tables.append(Table(unprefixed(name, dialect.prefix), columns, key, tuple(indexes),
                                key_ordered="WITHOUT ROWID" in sql.upper()))  # fmt: skip
        return normal(Schema(tuple(tables)))
    finally:
        conn.close()


def read_postgres(conn: Any, dialect: Dialect) -> Schema:
    """``conn``: a psycopg connection to the database (its ``public`` schema)."""
    columns: dict[str, list[Column]] = {}
    for table, name, kind, nullable, default in conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
    ).fetchall():
        portable = _type(dialect, kind)
        columns.setdefault(table, []).append(Column(name, portable, nullable=nullable == "YES",
                                                    default=_default(default, portable)))  # fmt: skip
    keys: dict[str, list[str]] = {}
    for table, column in conn.execute(
        "SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc "
        "JOIN information_schema.key_column_usage kcu ON kcu.constraint_schema = tc.constraint_schema "
        "AND kcu.constraint_name = tc.constraint_name "
        "WHERE tc.table_schema = 'public' AND tc.constraint_type = 'PRIMARY KEY' ORDER BY kcu.ordinal_position"
    ).fetchall():
        keys.setdefault(table, []).append(column)
    indexes: dict[str, list[Index]] = {}
    for table, name, cols, where in conn.execute(
        "SELECT t.relname, c.relname, ARRAY(SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY "
        "AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum ORDER BY k.n), "
        "pg_get_expr(i.indpred, i.indrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace ns ON ns.oid = t.relnamespace "
        "WHERE ns.nspname = 'public' AND NOT i.indisprimary"
    ).fetchall():
        indexes.setdefault(table, []).append(Index(unprefixed(name, dialect.prefix), tuple(cols), where))
    counters = tuple(Counter(unprefixed(name, dialect.prefix)) for (name,) in conn.execute(
        "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'public'").fetchall())
    tables = tuple(Table(unprefixed(name, dialect.prefix), tuple(cols), tuple(keys.get(name, ())),
                         tuple(indexes.get(name, ())))
                   for name, cols in columns.items())
    return normal(Schema(tables, counters), key_ordered=False)
