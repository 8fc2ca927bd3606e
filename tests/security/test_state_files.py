"""What agentd leaves in its state directory is the operator's alone: created 0600 whatever the umask (the journal,
its ``-wal`` and ``-shm`` files, the health file, the report file), and a known secret value that an instruction
quotes is journaled as ``***``.

Before: with the common umask 022 every one of those files was created 0644 inside a 0755 state directory (SQLite
gives its companion files the database file's mode), readable by every local user; and an instruction a peer
served (``subagent.spawn``) that quoted the daemon's own bearer token was stored verbatim.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.journal.records import RunStarted, redacted
from agentd.journal.sqlite import JournalFile, open_journal
from agentd.security.secrets import SecretResolver
from agentd.selfmcp.journaled import NAMESPACE
from agentd.telemetry.events import EventLog, Redactor
from agentd.telemetry.private_files import open_private, prepare_database
from tests.integration.agents import agentd_worker
from tests.waiting import until

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

TOKEN = "s3rve-t0ken-9f2c7d1e"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_journal_and_its_wal_and_shm_files_are_created_0600(tmp_path: Path, umask_022: None) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    path = state / "journal.sqlite3"
    journal = JournalFile(str(path))
    try:
        journal.append("run-1", (RunStarted("sha256:x", "hello", None, None, None),), True)
        files = {p.name: _mode(p) for p in state.iterdir()}
        assert {"journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm"} <= set(files), files
        assert set(files.values()) == {0o600}, files
    finally:
        journal.conn.close()


def test_files_an_older_agentd_left_readable_are_tightened(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "journal.sqlite3"
    for name in ("journal.sqlite3", "journal.sqlite3-wal"):
        (tmp_path / name).write_bytes(b"")
        os.chmod(tmp_path / name, 0o644)
    prepare_database(str(path))
    assert {_mode(p) for p in tmp_path.iterdir()} == {0o600}
    report = tmp_path / "report.tmp"
    report.write_text("old")
    os.chmod(report, 0o644)
    with open_private(str(report)) as file:
        file.write("new")
    assert report.read_text() == "new" and _mode(report) == 0o600


def test_a_record_quoting_a_known_secret_is_redacted() -> None:
    redactor = Redactor()
    redactor.add(TOKEN)
    record = RunStarted("sha256:x", f"use {TOKEN} to log in", {"token": [TOKEN]}, None, ("a", "b"))
    clean = redacted(record, redactor)
    assert clean.instruction == "use *** to log in" and clean.contract == {"token": ["***"]}
    assert clean.seed_runs == ("a", "b")  # a tuple stays a tuple
    assert redacted(record, None) is record


async def test_a_served_daemon_keeps_its_state_files_0600_and_never_journals_a_secret(
        tmp_path: Path, umask_022: None) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    health, report = state / "health.json", state / "report.jsonl"
    argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-bearer", "{{secret:SERVE_TOKEN}}",
            "--intelligence", "test", "--state-dir", str(state), "--health-file", str(health),
            "--report-file", str(report), "--drain-timeout", "3"]
    async with agentd_worker(argv, env={"SERVE_TOKEN": TOKEN}) as worker:
        server = McpServerConfig(name="worker", url=worker.url,
                                 headers={"Authorization": "Bearer {{secret:SERVE_TOKEN}}"})
        pool_log = EventLog(sink=lambda line: None)
        with trio.fail_after(60):
            async with open_mcp_pool([server], log=pool_log, secrets=SecretResolver(env={"SERVE_TOKEN": TOKEN}),
                                     run_id="test") as pool:
                answer: Any = await pool.call_tool("worker", "subagent.spawn", {
                    "instruction": f"log in with the token {TOKEN} and say hi", "warm": True})
                assert answer.structured is not None and answer.structured["handle"] == "served.1", answer
            await until(health.exists, timeout=60, what="health.json")
        files = {p.name: _mode(p) for p in state.iterdir() if not p.name.endswith(".sock")}
        assert {"journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm", "health.json"} <= set(files), files
        assert set(files.values()) == {0o600}, files
    assert _mode(report) == 0o600 and _mode(health) == 0o600
    for path in state.iterdir():
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    # the instruction itself is still there, with the secret value redacted
    async with open_journal(str(state)) as journal:
        served = await journal.get_state(NAMESPACE)
    assert "log in with the token *** and say hi" in str(served), served


async def test_the_cluster_journal_redacts_records_and_state_too(pg_dsn: str) -> None:
    from agentd.cluster.store import open_pg_journal
    from tests.postgres import PASSWORD

    redactor = Redactor()
    redactor.add(TOKEN)
    async with open_pg_journal(pg_dsn, PASSWORD) as journal:
        journal.redactor = redactor
        await journal.append("run-s", [RunStarted("sha256:x", f"token {TOKEN}", None, None, None)], durable=True)
        await journal.put_state("serve.handles", {"served.1": {"instruction": f"say {TOKEN}"}})
        run = await journal.read_run("run-s")
        state = await journal.get_state("serve.handles")
    assert run is not None and TOKEN not in str(run) and "token ***" in str(run)
    assert state == {"served.1": {"instruction": "say ***"}}
