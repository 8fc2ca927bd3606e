"""The cluster schema: versioned, forward-only migrations, and the refusal of a newer schema.

The schema itself is declared once for both stores (agentd.journal.schema); its PostgreSQL rendering
(agentd.journal.ddl) gives the statements from any released version to this one.

Why forward-only: members of different versions share one database during a rolling upgrade. A migration only
adds (tables, columns with defaults, indexes), so an older member keeps working on a newer schema of the same
major shape until it is replaced; a schema version above :data:`SCHEMA_VERSION` means a newer agentd wrote
it, and this one refuses to start instead of guessing (:class:`~agentd.cluster.errors.ClusterSchemaError`).

Who migrates: a daemon creates the schema on an empty database (version 0) by itself; an existing schema
older than this agentd is upgraded only by ``agentd cluster migrate`` (an explicit step of the rollout).
Both run under one transaction-scoped advisory lock, so two members starting at once do not race.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from agentd.cluster.errors import ClusterSchemaError
from agentd.journal.ddl import POSTGRES

#: The schema this agentd writes and reads (agentd.journal.schema, as PostgreSQL holds it); a database with a
#: larger version is refused.
SCHEMA_VERSION: Final = POSTGRES.version
#: The advisory lock key migrations hold (an arbitrary constant: "agentd" in ASCII).
LOCK_KEY: Final = 0x6167656E7464


def _has_meta(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('agentd_meta') IS NOT NULL").fetchone()
    return bool(row is not None and row[0])


def current_version(conn: psycopg.Connection[Any]) -> int:
    """0 for a database without the agentd schema."""
    if not _has_meta(conn):
        return 0
    found = conn.execute("SELECT value FROM agentd_meta WHERE key = 'schema_version'").fetchone()
    if found is None:
        raise ClusterSchemaError("cluster database: agentd_meta has no schema_version (not an agentd schema)")
    return int(found[0])


def check(conn: psycopg.Connection[Any], where: str, *, migrate: bool) -> tuple[int, int]:
    """Bring the schema to :data:`SCHEMA_VERSION` as allowed; return (version before, version after).

    ``migrate`` False (a daemon starting) creates the schema on an empty database only.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        before = current_version(conn)
        empty = before == 0 and not _has_meta(conn)
        if before > SCHEMA_VERSION:
            raise ClusterSchemaError(
                f"cluster database {where}: schema version {before} was written by a newer agentd; this one "
                f"reads up to {SCHEMA_VERSION} (upgrade agentd)")
        if before == SCHEMA_VERSION:
            return before, before
        if not empty and not migrate:
            raise ClusterSchemaError(
                f"cluster database {where}: schema version {before} is older than this agentd's "
                f"{SCHEMA_VERSION}; run `agentd cluster migrate --cluster DSN` first")
        for statement in POSTGRES.migration(before):
            conn.execute(statement.encode())
        if empty:
            conn.execute("INSERT INTO agentd_meta (key, value) VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),))
        else:
            conn.execute("UPDATE agentd_meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    return before, SCHEMA_VERSION
