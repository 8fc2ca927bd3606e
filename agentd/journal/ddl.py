"""The journal schema (agentd.journal.schema) rendered as each store's DDL: SQLite and PostgreSQL.

Why renderings, not SQL files: the two dialects differ in a handful of words (a type's name, how a boolean
literal is spelled, SQLite's ``WITHOUT ROWID``, PostgreSQL's ``agentd_`` prefix that keeps agentd's tables apart
in a database other programs may share). Everything else (which tables, columns, keys and indexes, and which
version added each) is the one declaration both are rendered from, so they cannot drift apart.

:meth:`Dialect.migration` is every statement that brings a database from a version to the dialect's current
one (from 0: the whole schema), in an order that works: tables, then columns added to older tables, then
indexes and sequences. The caller runs them in one transaction and records the version (agentd.journal.sqlite,
agentd.cluster.migrations). Only DDL is rendered here: the queries of the hot paths are plain SQL strings of
their stores, untouched by this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from agentd.journal.schema import SCHEMA, Column, ColumnType, Schema, Scope, Table


@attrs.frozen
class Dialect:
    name: str
    #: Before every table, index and sequence name.
    prefix: str
    #: The SQL type name of each portable type (one to one, so a type reads back unambiguously).
    types: Mapping[ColumnType, str]
    #: Which scopes this store holds (agentd.journal.schema).
    scopes: frozenset[Scope]
    #: How ``True``/``False`` are written as a column default.
    true: str
    false: str
    #: After a key-ordered table's closing parenthesis.
    key_ordered: str = ""
    #: Whether the dialect has sequences (SQLite has none: a counter must be of a scope it does not hold).
    counters: bool = True
    schema: Schema = SCHEMA

    @property
    def holds(self) -> Schema:
        """The part of the schema this store holds."""
        return self.schema.scoped(self.scopes)

    @property
    def version(self) -> int:
        """The version this agentd writes in this store; a database with a larger one is refused."""
        return self.holds.version

    def named(self, name: str) -> str:
        return self.prefix + name

    def literal(self, value: str | int | bool) -> str:
        if isinstance(value, bool):
            return self.true if value else self.false
        if isinstance(value, int):
            return str(value)
        return "'" + value.replace("'", "''") + "'"

    def column(self, column: Column) -> str:
        text = f"{column.name} {self.types[column.type]}"
        if not column.nullable:
            text += " NOT NULL"
        if column.default is not None:
            text += f" DEFAULT {self.literal(column.default)}"
        return text

    def create_table(self, table: Table) -> str:
        parts = [self.column(c) for c in table.columns]
        parts.append(f"PRIMARY KEY ({', '.join(table.key)})")
        return (f"CREATE TABLE {self.named(table.name)} ({', '.join(parts)})"
                + (self.key_ordered if table.key_ordered else ""))  # fmt: skip

    def migration(self, before: int) -> tuple[str, ...]:
        """The statements that bring a database of version ``before`` (0: empty) to :attr:`version`."""
        schema = self.holds
        tables = [self.create_table(t) for t in schema.tables if t.since > before]
        columns = [f"ALTER TABLE {self.named(t.name)} ADD COLUMN {self.column(c)}"
                   for t in schema.tables for c in t.columns if t.since <= before < c.since]  # fmt: skip
        indexes = [
            f"CREATE INDEX {self.named(i.name)} ON {self.named(t.name)} ({', '.join(i.columns)})"
            + (f" WHERE {i.where}" if i.where is not None else "")
            for t in schema.tables for i in t.indexes if i.since > before
        ]
        if schema.counters and not self.counters:
            raise ValueError(f"journal schema: {self.name} has no sequences, yet holds {schema.counters[0].name}")
        counters = [f"CREATE SEQUENCE {self.named(c.name)}" for c in schema.counters if c.since > before]
        return (*tables, *columns, *indexes, *counters)


#: The SQLite journal file: the journal's tables alone, unprefixed (the file is agentd's own).
SQLITE: Final = Dialect(
    "sqlite", "",
    {"text": "TEXT", "real": "REAL", "integer": "INTEGER", "bigint": "BIGINT", "boolean": "BOOLEAN"},
    frozenset({"journal"}), true="1", false="0", key_ordered=" WITHOUT ROWID", counters=False,
)
#: The cluster's PostgreSQL database: the journal and the cluster's own tables, each name prefixed ``agentd_``.
POSTGRES: Final = Dialect(
    "postgres", "agentd_",
    {"text": "TEXT", "real": "DOUBLE PRECISION", "integer": "INTEGER", "bigint": "BIGINT", "boolean": "BOOLEAN"},
    frozenset({"journal", "cluster"}), true="true", false="false",
)
