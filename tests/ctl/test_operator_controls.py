"""Operator controls with real processes: a daemon serves ``agentd ctl`` on its control socket, and
``agentd ctl`` runs as a subprocess. Pause holds the next turn (calls in flight finish) and survives a
SIGKILL with ``--state-dir``; cancel ends a run by its id; lame duck holds new runs and reports not-ready;
the socket is owner-only and a stale one is replaced."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys

import pytest
import trio

from agentd.journal.sqlite import JournalFile, db_path
from tests.ctl.daemon import ctl, daemon, env, kill
from tests.durable.peer import counting_peer
from tests.peers.gateway import Rule, ScriptedGateway, scripted_gateway, text, tool_call

pytestmark = pytest.mark.interop


def chats(gw: ScriptedGateway) -> list[object]:
    return [r for r in gw.requests if r.path.endswith("/chat/completions")]


async def test_pause_holds_the_next_turn_survives_a_crash_and_resume_finishes(tmp_path):
    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    release = trio.Event()
    async with (
        scripted_gateway(rules=[Rule({"last_role": "tool"}, text("k1 looked up"))],
                         default=tool_call("pay__lookup", {"key": "k1"}, wait=release)) as gw,
        counting_peer() as peer,
    ):
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "Look k1 up.",
                "--run-id", "paused-1", "--state-dir", str(state), "--deadline", "120s"]
        async with daemon(argv, tmp_path, "first") as first:
            await first.until(lambda: len(chats(gw)) == 1)  # the first model call is in flight
            code, doc = await ctl("pause", "--socket", sock)
            assert code == 0 and doc == {"paused": True, "affected": 1, "saved": True}
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
            release.set()  # the call in flight finishes, its tool call runs, then the run waits
            status = await first.until_status(sock, lambda d: bool(d["runs"]) and d["runs"][0]["paused"])
            assert status["paused"] is True and status["runs"][0]["run_id"] == "paused-1"
            assert status["runs"][0]["step"] == 1
            assert len(chats(gw)) == 1 and peer.count("lookup") == 1  # no new turn started
            kill(first)
            await first.wait()
        assert os.path.exists(sock)  # left by the killed daemon: stale

        async with daemon(argv, tmp_path, "second") as second:
            status = await second.until_status(sock, lambda d: bool(d["runs"]) and d["runs"][0]["paused"])
            assert status["paused"] is True
            assert [e.get("restored") for e in second.events("ctl.pause")] == [True]
            assert len(chats(gw)) == 1  # resumed from the journal, and still paused
            code, doc = await ctl("resume", "--socket", sock)
            assert code == 0 and doc["paused"] is False and doc["affected"] == 1
            code, result = await second.wait()
        assert code == 0 and result["status"] == "completed" and result["result"] == "k1 looked up"
        assert len(chats(gw)) == 2 and peer.count("lookup") == 1
        assert not os.path.exists(sock)  # removed at exit

        # resumed and finished: the saved paused state is gone with the resume
        journal = JournalFile(db_path(str(state)), readonly=True)
        try:
            assert journal.get_state("operator") == {}
        finally:
            journal.close()


async def test_cancel_by_run_id_ends_the_run_cancelled_and_journals_it(tmp_path):
    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    never = trio.Event()
    async with scripted_gateway(default=text("never", wait=never)) as gw:
        argv = ["--intelligence", gw.url, "--instruction", "Think forever.", "--run-id", "doomed",
                "--state-dir", str(state), "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            await d.until(lambda: len(chats(gw)) == 1)
            code, doc = await ctl("cancel", "nobody", "--socket", sock)
            assert code == 1 and "nobody" in doc["error"]
            code, doc = await ctl("cancel", "doomed", "--reason", "wrong customer", "--socket", sock)
            assert code == 0 and doc == {"cancelled": "doomed", "kind": "run"}
            code, result = await d.wait()
            never.set()
        assert result["status"] == "cancelled" and code == 1
        assert [e["reason"] for e in d.events("run.cancelled")] == ["wrong customer"]
        assert [e["run"] for e in d.events("ctl.cancel")] == ["doomed"]
        listed = await trio.run_process([sys.executable, "-m", "agentd", "journal", "list", "--state-dir",
                                         str(state)], capture_stdout=True, env=env())
        runs = json.loads(listed.stdout)["runs"]
        assert [(r["run_id"], r["status"]) for r in runs] == [("doomed", "cancelled")]  # not resumed again


async def test_lame_duck_holds_new_runs_reports_not_ready_and_lifts(tmp_path):
    sock = str(tmp_path / "agentd.sock")
    health = tmp_path / "health.json"
    async with scripted_gateway(default=text("tick")) as gw:
        argv = ["--mode", "loop", "--interval", "200ms", "--intelligence", gw.url, "--instruction", "Tick.",
                "--ctl-socket", sock, "--health-file", str(health)]
        async with daemon(argv, tmp_path) as d:
            await d.until_status(sock, lambda s: s["daemon"] is not None and s["daemon"]["runs"] >= 1)
            code, doc = await ctl("lame-duck", "--socket", sock)
            assert code == 0 and doc == {"lame_duck": True, "ready": False}
            status = await d.until_status(sock, lambda s: s["held"] == 1)  # the next fire waits
            assert status["lame_duck"] is True and status["capacity"]["accepting"] is False
            held_at = len(chats(gw))
            await d.until(lambda: json.loads(health.read_text() or "{}").get("lame_duck") is True)
            assert json.loads(health.read_text())["ready"] is False
            status = await d.until_status(sock, lambda s: True)
            assert status["held"] == 1 and status["daemon"]["running"] == 0 and len(chats(gw)) == held_at

            code, doc = await ctl("lame-duck", "--off", "--socket", sock)
            assert code == 0 and doc == {"lame_duck": False, "ready": True}
            await d.until(lambda: len(chats(gw)) > held_at)
            d.proc.send_signal(__import__("signal").SIGTERM)
            code, result = await d.wait()
        assert code == 0 and result["status"] == "completed"


async def test_a_live_socket_is_refused_a_missing_or_stale_one_is_a_clear_error(tmp_path):
    sock = str(tmp_path / "c.sock")
    code, doc = await ctl("status", "--socket", sock)
    assert code == 3 and "no control socket" in doc["error"]
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(sock)  # a socket file nobody listens on: what a killed daemon leaves
    leftover.close()
    code, doc = await ctl("status", "--socket", sock)
    assert code == 3 and "stale" in doc["error"]
    code, doc = await ctl("status")
    assert code == 2 and doc == {}  # usage: no socket named at all

    async with scripted_gateway(default=text("tick")) as gw:
        argv = ["--mode", "loop", "--interval", "1h", "--intelligence", gw.url, "--instruction", "Tick.",
                "--ctl-socket", sock]
        async with daemon(argv, tmp_path, "first") as first:  # replaces the stale socket
            await first.until_status(sock, lambda s: s["mode"] == "loop")
            async with daemon(argv, tmp_path, "second") as second:
                code, _ = await second.wait()
            assert code == 2 and "another agentd is listening" in second.stderr.read_text()
            code, doc = await ctl("status", "--socket", sock)
            assert code == 0 and doc["pid"] == first.proc.pid
