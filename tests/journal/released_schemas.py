"""The journal schemas agentd released, as the code that wrote them had them (verbatim, never edited).

A database one of these created must keep opening with every later agentd (tests/journal/test_schema.py): the
declaration in agentd.journal.schema renders the same tables, and its migrations start from these versions.
"""

from __future__ import annotations

from typing import Final

#: The SQLite journal file, version 1 (``meta.schema_version`` = 1).
SQLITE_V1: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, status TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL,
    parent TEXT, next_seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_running ON runs (started_at) WHERE ended_at IS NULL;
CREATE TABLE IF NOT EXISTS entries (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (
    namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
"""

#: The cluster's PostgreSQL schema: version 1, then what version 2 added.
POSTGRES_V1: Final = """
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
"""
POSTGRES_V2: Final = """
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
"""


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
