"""``agentd journal list|show|export`` as a real process: one JSON document on stdout, exit codes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import trio

from agentd.journal.records import RunEnded, RunStarted, Spawned
from agentd.journal.sqlite import DB_NAME, open_journal
from tests.journal.helpers import step


def agentd(*args: str, state_dir: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTD_STATE_DIR"}
    if state_dir is not None:
        env["AGENTD_STATE_DIR"] = state_dir
    return subprocess.run([sys.executable, "-m", "agentd", "journal", *args], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


async def _fill(state_dir: str) -> None:
    async with open_journal(state_dir) as journal:
        await journal.append("done", [RunStarted("d", "first")])
        await journal.append("done", step(0))
        await journal.append("done", [Spawned(1, "h-1", "sub", budget=100), RunEnded("completed", "ok")])
        await journal.append("live", [RunStarted("d", "second", parent="h-1")])


async def test_list_show_export(tmp_path):
    await _fill(str(tmp_path))
    listed = await trio.to_thread.run_sync(lambda: agentd("list", state_dir=str(tmp_path)))
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)["runs"]
    assert {r["run_id"]: r["status"] for r in runs} == {"done": "completed", "live": "running"}
    only = json.loads((await trio.to_thread.run_sync(
        lambda: agentd("list", "--status", "running", "--state-dir", str(tmp_path)))).stdout)  # fmt: skip
    assert [r["run_id"] for r in only["runs"]] == ["live"] and only["runs"][0]["parent"] == "h-1"

    shown = await trio.to_thread.run_sync(lambda: agentd("show", "done", state_dir=str(tmp_path)))
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["run"]["records"] == 7
    assert [r["kind"] for r in doc["records"]] == [
        "run.started", "model.reply", "tool.requested", "tool.outcome", "usage", "spawn", "run.ended"]
    assert doc["records"][2] == {"seq": 2, "ts": doc["records"][2]["ts"], "kind": "tool.requested", "step": 0,
                                 "call_id": "call-0", "name": "docs__search"}  # fmt: skip
    assert "result " not in shown.stdout  # show leaves payloads to export

    exported = await trio.to_thread.run_sync(lambda: agentd("export", "done", state_dir=str(tmp_path)))
    doc = json.loads(exported.stdout)
    assert doc["format"] == "agentd.journal.run" and doc["schema_version"] == 1
    assert doc["records"][3]["result"] == "result " * 20 and doc["records"][6]["result"] == "ok"
    assert all(r["v"] == 1 for r in doc["records"])


async def test_errors(tmp_path):
    missing = await trio.to_thread.run_sync(lambda: agentd("show", "nope", state_dir=str(tmp_path)))
    assert missing.returncode == 1 and "no run 'nope'" in json.loads(missing.stdout)["error"]
    assert json.loads((await trio.to_thread.run_sync(
        lambda: agentd("list", state_dir=str(tmp_path)))).stdout) == {"runs": []}  # fmt: skip
    no_dir = await trio.to_thread.run_sync(lambda: agentd("list"))
    assert no_dir.returncode == 2 and "AGENTD_STATE_DIR" in no_dir.stderr
    no_run = await trio.to_thread.run_sync(lambda: agentd("export", state_dir=str(tmp_path)))
    assert no_run.returncode == 2 and "RUN is required" in no_run.stderr

    await _fill(str(tmp_path))
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    newer = await trio.to_thread.run_sync(lambda: agentd("list", state_dir=str(tmp_path)))
    assert newer.returncode == 2 and "newer agentd" in newer.stderr and newer.stdout == ""


def _once(run_id: str, state_dir: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTD_")}
    return subprocess.run([sys.executable, "-m", "agentd", "--instruction", "hi", "--intelligence", "test",
                           "--state-dir", state_dir, "--run-id", run_id, *extra],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def test_retention_flags_prune_finished_runs_when_the_state_dir_opens(tmp_path):
    state = str(tmp_path)
    for run_id in ("a", "b"):
        assert _once(run_id, state).returncode == 0
    # Opening with --journal-keep-runs 1 keeps only the newest finished run (b); c is then journaled too.
    assert _once("c", state, "--journal-keep-runs", "1").returncode == 0
    listed = json.loads(agentd("list", state_dir=state).stdout)
    assert sorted(r["run_id"] for r in listed["runs"]) == ["b", "c"]
    # 0 switches the bound off: nothing more is pruned, whatever the count.
    assert _once("d", state, "--journal-keep-runs", "0", "--journal-keep-for", "0").returncode == 0
    listed = json.loads(agentd("list", state_dir=state).stdout)
    assert sorted(r["run_id"] for r in listed["runs"]) == ["b", "c", "d"]
    bad = _once("e", state, "--journal-keep-for", "soon")
    assert bad.returncode == 2 and "--journal-keep-for" in bad.stderr
