"""The durable transcript: each data policy, retention, ``agentd transcript show``, and a SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import trio

from agentd.connections.transcript import read_run
from tests.connections.helpers import connection, files, run
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.waiting import until

ARG = "argument-value-31337"


def host_for(gw, peer, db, policy, retention=30):
    return {
        "intelligence": {"url": gw.url},
        "connections": {
            "docs": connection(f"{peer.origin}/mcp", tools=["search", "slow"], mode="read_write")
        },
        "transcript": {"path": str(db), "dataPolicy": policy, "retentionDays": retention},
    }


MANIFEST = {
    "connections": [{"ref": "docs", "alias": "docs"}],
    "steps": [{"id": "s1", "prompt": "Look it up.", "tools": ["docs__search"]}],
}


@pytest.mark.parametrize("policy", ["full", "redact_tool_values", "metadata_only"])
async def test_data_policies(tmp_path, policy):
    db = tmp_path / "t.sqlite3"
    async with (
        mcp_peer() as peer,
        scripted_gateway([tool_call("docs__search", {"q": ARG}), text("the answer")]) as gw,
    ):
        with trio.fail_after(20):
            outcome = await run(tmp_path, host_for(gw, peer, db, policy), MANIFEST)
    assert outcome.code == 0, outcome.raw
    doc = read_run(str(db), "run-1")
    assert doc is not None and doc["status"] == "completed" and doc["policy"] == policy
    kinds = [e["kind"] for e in doc["entries"]]
    assert kinds == ["step.start", "model.reply", "tool.result", "model.reply", "step.end"]
    reply, result = doc["entries"][1], doc["entries"][2]
    assert result["call_id"] and result["name"] == "docs__search" and result["size"] > 0
    dump = json.dumps(doc)
    if policy == "full":
        assert json.loads(reply["content"]["tool_calls"][0]["arguments"]) == {"q": ARG}
        assert ARG in result["content"]["observation"]
        assert doc["result"] == "the answer"
    elif policy == "redact_tool_values":
        assert ARG not in dump
        assert reply["content"]["tool_calls"][0]["arguments"] == "[redacted]"
        assert result["content"] == "[redacted]"
        assert doc["entries"][0]["content"] == "Look it up." and doc["result"] == "the answer"
    else:
        assert ARG not in dump and "the answer" not in dump and "Look it up." not in dump
        assert all(e["content"] is None for e in doc["entries"]) and doc["result"] is None


async def test_retention_removes_old_runs(tmp_path):
    db = tmp_path / "t.sqlite3"
    async with mcp_peer() as peer, scripted_gateway([text("a"), text("b")]) as gw:
        with trio.fail_after(20):
            await run(tmp_path, host_for(gw, peer, db, "full"), MANIFEST)
        conn = sqlite3.connect(db)
        with conn:
            conn.execute(
                "UPDATE runs SET run_id = 'old', started_at = ? WHERE run_id = 'run-1'",
                (time.time() - 3 * 86400,),
            )
            conn.execute("UPDATE entries SET run_id = 'old'")
        conn.close()
        with trio.fail_after(20):
            await run(tmp_path, host_for(gw, peer, db, "full", retention=2), MANIFEST)
    assert read_run(str(db), "old") is None and read_run(str(db), "run-1") is not None
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM entries WHERE run_id = 'old'").fetchone()[0] == 0
    conn.close()


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}


async def test_sigkill_mid_run_loses_nothing_and_show_prints_it(tmp_path):
    db = tmp_path / "t.sqlite3"
    manifest = {
        "connections": [{"ref": "docs", "alias": "docs"}],
        "steps": [{"id": "s1", "prompt": "Go slow.", "tools": ["docs__slow"]}],
    }
    async with (
        mcp_peer() as peer,
        scripted_gateway([tool_call("docs__slow", {"seconds": 600}), text("x")]) as gw,
    ):
        argv = [
            sys.executable,
            "-m",
            "agentd",
            "run",
            *files(tmp_path, host_for(gw, peer, db, "full"), manifest),
            "--run-id",
            "killed-run",
        ]
        proc = await trio.lowlevel.open_process(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env()
        )
        try:
            await until(lambda: peer.calls, timeout=30, what="the tool call in flight on the server")

            def committed() -> bool:  # and its request is committed (the writer runs concurrently with the call)
                doc = read_run(str(db), "killed-run")
                return bool(doc and any(e["kind"] == "model.reply" for e in doc["entries"]))

            await until(committed, timeout=30, what="the model reply committed")
        finally:
            proc.send_signal(signal.SIGKILL)
            with trio.fail_after(10):
                await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    shown = subprocess.run(
        [sys.executable, "-m", "agentd", "transcript", "show", "killed-run", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["status"] == "running" and doc["ended_at"] is None
    assert [e["kind"] for e in doc["entries"]] == ["step.start", "model.reply"]
    assert doc["entries"][1]["content"]["tool_calls"][0]["name"] == "docs__slow"
    missing = subprocess.run(
        [sys.executable, "-m", "agentd", "transcript", "show", "nope", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert missing.returncode == 1 and "no transcript" in missing.stdout


async def test_cancelled_run_keeps_what_was_recorded(tmp_path):
    db = tmp_path / "t.sqlite3"
    manifest = {"connections": [{"ref": "docs", "alias": "docs"}],
                "steps": [{"id": "s1", "prompt": "Go slow.", "tools": ["docs__slow"]}]}
    async with mcp_peer() as peer, scripted_gateway([tool_call("docs__slow", {"seconds": 600}), text("x")]) as gw:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, tmp_path, host_for(gw, peer, db, "full"), manifest)
            with trio.fail_after(20):
                await peer.called.wait()
            nursery.cancel_scope.cancel()  # cancelled from outside while the tool call is in flight
    doc = read_run(str(db), "run-1")
    assert doc["status"] == "cancelled" and doc["ended_at"] is not None
    assert [e["kind"] for e in doc["entries"]] == ["step.start", "model.reply"]


async def test_sigterm_drains_then_cancels_at_the_drain_timeout(tmp_path):
    db = tmp_path / "t.sqlite3"
    manifest = {"connections": [{"ref": "docs", "alias": "docs"}],
                "steps": [{"id": "s1", "prompt": "Go slow.", "tools": ["docs__slow"]},
                          {"id": "s2", "prompt": "never reached", "tools": []}]}
    async with mcp_peer() as peer, scripted_gateway([tool_call("docs__slow", {"seconds": 600}), text("x")]) as gw:
        argv = [sys.executable, "-m", "agentd", "run", *files(tmp_path, host_for(gw, peer, db, "full"), manifest),
                "--run-id", "drained-run", "--drain-timeout", "0.5"]
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env())
        try:
            with trio.fail_after(30):
                await peer.called.wait()
                proc.send_signal(signal.SIGTERM)
                out = b""
                while chunk := await proc.stdout.receive_some(65536):
                    out += chunk
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    assert proc.returncode == 0
    doc = json.loads(out.decode().strip().splitlines()[-1])
    assert doc["status"] == "cancelled" and doc["done"] is True  # ended, as in every other end state
    assert len(gw.requests) == 1  # no further model call, no second step
    assert read_run(str(db), "drained-run")["status"] == "cancelled"
