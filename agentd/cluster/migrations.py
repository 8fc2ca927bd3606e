"""The cluster schema: versioned, forward-only migrations, and the refusal of a newer schema.

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

#: (version, statements) in order; never edit a released entry, append a new one.
MIGRATIONS: Final[tuple[tuple[int, str], ...]] = (
    (1, """
CREATE TABLE agentd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE agentd_runs (
    run_id TEXT PRIMARY KEY, status TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION, parent TEXT, next_seq INTEGER NOT NULL
);
CREATE INDEX agentd_runs_ended ON agentd_runs (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX agentd_runs_running ON agentd_runs (started_at) WHERE ended_at IS NULL;
CREATE TABLE agentd_entries (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (run_id, seq)
);
CREATE TABLE agentd_state (
    namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE SEQUENCE agentd_fence;
CREATE TABLE agentd_leases (
    run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token BIGINT NOT NULL, expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX agentd_leases_owner ON agentd_leases (owner);
CREATE TABLE agentd_members (
    member_id TEXT PRIMARY KEY, address TEXT, capacity INTEGER NOT NULL, started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE agentd_work (
    work_id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    not_before DOUBLE PRECISION NOT NULL, status TEXT NOT NULL DEFAULT 'open', owner TEXT, token BIGINT,
    attempts INTEGER NOT NULL DEFAULT 0, claimed_at DOUBLE PRECISION, finished_at DOUBLE PRECISION,
    cancel_requested BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX agentd_work_open ON agentd_work (created_at) WHERE status = 'open';
"""),
    # Subscriptions owned by one member at a time (agentd.cluster.subscriptions), and who takes part in owning them.
    (2, """
CREATE TABLE agentd_subscriptions (
    sub_id TEXT PRIMARY KEY, scope TEXT NOT NULL, uri TEXT NOT NULL, server TEXT, origin TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, owner TEXT, token BIGINT, expires_at DOUBLE PRECISION, digest TEXT,
    wakes BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX agentd_subscriptions_scope ON agentd_subscriptions (scope, created_at);
CREATE TABLE agentd_subscribers (
    scope TEXT NOT NULL, member_id TEXT NOT NULL, capacity INTEGER NOT NULL, seen_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scope, member_id)
);
"""),
)
#: The schema this agentd writes and reads; a database with a larger version is refused.
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]
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
        for version, statements in MIGRATIONS:
            if version > before:
                for statement in filter(None, (s.strip() for s in statements.split(";"))):
                    conn.execute(statement.encode())
        if empty:
            conn.execute("INSERT INTO agentd_meta (key, value) VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),))
        else:
            conn.execute("UPDATE agentd_meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    return before, SCHEMA_VERSION
