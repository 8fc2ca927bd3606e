"""The journal's schema, declared once: every table, column, key, index and sequence of both stores.

Why one declaration: the SQLite file (agentd.journal.sqlite) and the cluster's PostgreSQL database
(agentd.cluster.migrations) hold the same journal in two SQL dialects. Written out twice, a column added to
one and forgotten in the other, or a type spelled differently, is found only when a run moves between them;
declared here once as values, each dialect's DDL is a rendering of it (agentd.journal.ddl), and a test reads
both real databases back and checks they agree (tests/journal/test_schema.py).

Versions: every element carries ``since``, the schema version that added it. Migrations only add (a table, a
column that is nullable or has a default, an index, a sequence), so bringing a database from version ``v`` up
is "create what came after ``v``" — derived, never written by hand. A released element is never edited or
removed; a change is a new element with a larger ``since``.

Scopes: ``journal`` tables are in both stores; ``cluster`` ones (leases, members, work, subscriptions, the
fencing sequence) only in PostgreSQL, where several members share them (the SQLite file has one process, whose
leases are in memory). Each store's version is the largest ``since`` of what it holds, so a change to the
cluster's tables leaves the SQLite files' version alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import attrs

#: The portable column types; each dialect maps each to one SQL type name (agentd.journal.ddl).
ColumnType = Literal["text", "real", "integer", "bigint", "boolean"]
#: Which stores hold an element: ``journal`` both, ``cluster`` the PostgreSQL database only.
Scope = Literal["journal", "cluster"]


@attrs.frozen
class Column:
    name: str
    type: ColumnType
    nullable: bool = False
    #: A constant the column takes when an insert leaves it out (and that fills existing rows when it is added).
    default: str | int | bool | None = None
    since: int = 1


@attrs.frozen
class Index:
    name: str
    columns: tuple[str, ...]
    #: A partial index's predicate, in SQL both dialects read the same (column names, literals, ``IS NULL``).
    where: str | None = None
    since: int = 1


@attrs.frozen
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    indexes: tuple[Index, ...] = ()
    scope: Scope = "journal"
    #: Rows stored in key order (SQLite ``WITHOUT ROWID``): tables read by key ranges, with small rows.
    key_ordered: bool = False
    since: int = 1

    def __attrs_post_init__(self) -> None:
        names = [c.name for c in self.columns]
        where = f"journal schema: table {self.name}"
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: a column is declared twice")
        if not self.key or not set(self.key) <= set(names):
            raise ValueError(f"{where}: its key {self.key} names no declared column")
        if [c.since for c in self.columns] != sorted(c.since for c in self.columns):
            raise ValueError(f"{where}: a column added later is declared before an older one (add it last)")
        for column in self.columns:
            if column.since < self.since:
                raise ValueError(f"{where}: column {column.name} is older than its table")
            if column.since > self.since and not (column.nullable or column.default is not None):
                raise ValueError(f"{where}: column {column.name}, added later, needs a default or to be nullable")
            if column.name in self.key and (column.nullable or column.since != self.since):
                raise ValueError(f"{where}: key column {column.name} must be NOT NULL and as old as the table")
        for index in self.indexes:
            if index.since < self.since or not set(index.columns) <= set(names):
                raise ValueError(f"{where}: index {index.name} names an unknown column or is older than the table")


@attrs.frozen
class Counter:
    """A counter shared by every connection (PostgreSQL ``CREATE SEQUENCE``): fencing tokens only grow."""

    name: str
    scope: Scope = "cluster"
    since: int = 1


@attrs.frozen
class Schema:
    tables: tuple[Table, ...]
    counters: tuple[Counter, ...] = ()

    def __attrs_post_init__(self) -> None:
        names = [t.name for t in self.tables] + [s.name for s in self.counters]
        names += [i.name for t in self.tables for i in t.indexes]
        if len(set(names)) != len(names):
            raise ValueError("journal schema: a name is declared twice")

    def scoped(self, scopes: Iterable[Scope]) -> Schema:
        """The part one store holds."""
        keep = frozenset(scopes)
        return Schema(tuple(t for t in self.tables if t.scope in keep),
                      tuple(s for s in self.counters if s.scope in keep))  # fmt: skip

    @property
    def version(self) -> int:
        """The largest ``since`` of any element: the version a database holding all of it is at."""
        sinces = [s.since for s in self.counters]
        for table in self.tables:
            sinces += [table.since, *(c.since for c in table.columns), *(i.since for i in table.indexes)]
        return max(sinces, default=0)


def _t(name: str) -> Column:
    return Column(name, "text")


def _r(name: str) -> Column:
    return Column(name, "real")


#: The journal. Released: version 1 (the journal, leases, members, work) and 2 (subscriptions).
SCHEMA: Final = Schema(
    tables=(
        Table("meta", (_t("key"), _t("value")), key=("key",)),
        Table(
            "runs",
            (_t("run_id"), _t("status"), _r("started_at"), Column("ended_at", "real", nullable=True),
             Column("parent", "text", nullable=True), Column("next_seq", "integer")),
            key=("run_id",),
            indexes=(Index("runs_ended", ("ended_at",), where="ended_at IS NOT NULL"),
                     Index("runs_running", ("started_at",), where="ended_at IS NULL")),
        ),
        Table("entries", (_t("run_id"), Column("seq", "integer"), _r("ts"), _t("kind"), _t("body")),
              key=("run_id", "seq"), key_ordered=True),
        Table("state", (_t("namespace"), _t("key"), _t("value"), _r("updated_at")),
              key=("namespace", "key"), key_ordered=True),
        Table("leases", (_t("run_id"), _t("owner"), Column("token", "bigint"), _r("expires_at")),
              key=("run_id",), indexes=(Index("leases_owner", ("owner",)),), scope="cluster"),
        Table("members", (_t("member_id"), Column("address", "text", nullable=True), Column("capacity", "integer"),
                          _r("started_at"), _r("heartbeat_at")),
              key=("member_id",), scope="cluster"),
        Table(
            "work",
            (_t("work_id"), _t("kind"), _t("payload"), _r("created_at"), _r("not_before"),
             Column("status", "text", default="open"), Column("owner", "text", nullable=True),
             Column("token", "bigint", nullable=True), Column("attempts", "integer", default=0),
             Column("claimed_at", "real", nullable=True), Column("finished_at", "real", nullable=True),
             Column("cancel_requested", "boolean", default=False)),
            key=("work_id",), indexes=(Index("work_open", ("created_at",), where="status = 'open'"),),
            scope="cluster",
        ),
        Table(
            "subscriptions",
            (Column("sub_id", "text", since=2), Column("scope", "text", since=2), Column("uri", "text", since=2),
             Column("server", "text", nullable=True, since=2), Column("origin", "text", since=2),
             Column("created_at", "real", since=2), Column("owner", "text", nullable=True, since=2),
             Column("token", "bigint", nullable=True, since=2), Column("expires_at", "real", nullable=True, since=2),
             Column("digest", "text", nullable=True, since=2), Column("wakes", "bigint", default=0, since=2)),
            key=("sub_id",), indexes=(Index("subscriptions_scope", ("scope", "created_at"), since=2),),
            scope="cluster", since=2,
        ),
        Table(
            "subscribers",
            (Column("scope", "text", since=2), Column("member_id", "text", since=2),
             Column("capacity", "integer", since=2), Column("seen_at", "real", since=2)),
            key=("scope", "member_id"), scope="cluster", since=2,
        ),
    ),
    counters=(Counter("fence"),),
)
