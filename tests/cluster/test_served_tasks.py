"""Served MCP tasks across cluster members: two real ``agentd --cluster --serve-mcp --serve-tasks`` processes on one
real PostgreSQL, OAuth principals from a real token issuer, the scripted gateway as their model.

A task created at member A (a task-augmented ``subagent.spawn``: a queued cluster row) is answered by member B's
``tasks/get`` and ``tasks/result`` for the principal that created it, with A's ``createdAt``, and listed by B's
``tasks/list``; for another principal it is exactly a task never created. After A is SIGKILLed, a new session
at B still answers the finished task, and the unfinished one (its run was on A, its model call out) is taken
over from its journal by B and ends there, its result served by B's ``tasks/result``.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentd.cluster.store import open_pg_journal
from tests.cluster.test_members import _members, _owners, _pid_of, _served_url, _wait_for
from tests.peers.gateway import Rule, scripted_gateway, text
from tests.postgres import PASSWORD
from tests.security.idp import idp
from tests.selfmcp.harness import LegacyPeer

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

HOLD = "HOLD: answer after a failover"
TTL = 3.0


def _argv(dsn: str, gateway: str, issuer: str, capacity: int) -> list[str]:
    return [sys.executable, "-m", "agentd", "--cluster", dsn, "--intelligence", gateway,
            "--cluster-lease-ttl", f"{TTL:g}s", "--cluster-capacity", str(capacity), "--deadline", "120s",
            "--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-tasks", "--serve-oauth-issuer", issuer]


async def _result(peer: LegacyPeer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await peer.call(method, params)
    assert "result" in answer, answer
    return dict(answer["result"])


async def _error(peer: LegacyPeer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await peer.call(method, params)
    assert "error" in answer, answer
    return dict(answer["error"])


async def _peer(client: httpx.AsyncClient, url: str, token: str) -> LegacyPeer:
    peer = LegacyPeer(client, url, headers={"authorization": f"Bearer {token}"})
    await peer.initialize()
    return peer


async def _status(peer: LegacyPeer, task_id: str, status: str) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        task = await _result(peer, "tasks/get", {"taskId": task_id})
        assert task["status"] in ("working", status), task
        return task if task["status"] == status else None

    return dict(await _wait_for(seen, 90))


async def test_a_task_created_at_one_member_answers_at_another_and_after_its_death(pg_dsn: str, tmp_path: Path
                                                                                   ) -> None:
    hang = trio.Event()  # never set: the held run's first model call, on A, never answers
    rules = [Rule({"contains": HOLD}, {"content": "never", "wait": hang}, 1),
             Rule({"contains": HOLD}, text("answered after the failover"))]
    async with idp() as authority, scripted_gateway(rules=rules, default=text("fine")) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store, httpx.AsyncClient(timeout=60) as client:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        async with _members(_argv(pg_dsn, gw.url, authority.issuer, 2), 1, tmp_path / "a") as [member_a]:
            url_a = _served_url(tmp_path / "a" / "member0.stderr")
            alice_a = await _peer(client, url_a, authority.mint(aud=url_a, sub="alice"))
            done = (await _result(alice_a, "tools/call", {"name": "subagent.spawn", "task": {"ttl": 60000},
                                                          "arguments": {"instruction": "say fine"}}))["task"]
            held = (await _result(alice_a, "tools/call", {"name": "subagent.spawn", "task": {"ttl": 60000},
                                                          "arguments": {"instruction": HOLD}}))["task"]
            assert done["taskId"].startswith("cluster.") and held["status"] == "working", (done, held)
            await _status(alice_a, done["taskId"], "completed")
            # The held task's run is A's (the only member yet), its model call out
            [owner] = await _wait_for(lambda: _owners(store, held["taskId"]))
            assert _pid_of(owner) == member_a.pid
            await _wait_for(lambda: _asked(gw, HOLD))

            async with _members(_argv(pg_dsn, gw.url, authority.issuer, 2), 1, tmp_path / "b"):
                url_b = _served_url(tmp_path / "b" / "member0.stderr")
                alice_b = await _peer(client, url_b, authority.mint(aud=url_b, sub="alice"))
                bob_b = await _peer(client, url_b, authority.mint(aud=url_b, sub="bob"))
                # B answers A's tasks to their creator, as A does (createdAt included)
                got = await _result(alice_b, "tasks/get", {"taskId": done["taskId"]})
                assert got["status"] == "completed" and got["createdAt"] == done["createdAt"], (got, done)
                on_a = await _result(alice_a, "tasks/result", {"taskId": done["taskId"]})
                assert await _result(alice_b, "tasks/result", {"taskId": done["taskId"]}) == on_a
                assert "fine" in json.dumps(on_a["content"])
                assert (await _result(alice_b, "tasks/get", {"taskId": held["taskId"]}))["status"] == "working"
                listed = (await _result(alice_b, "tasks/list", {}))["tasks"]
                assert sorted(t["taskId"] for t in listed) == sorted([done["taskId"], held["taskId"]]), listed
                # ... and to another principal exactly as a task never created
                assert (await _result(bob_b, "tasks/list", {}))["tasks"] == []
                for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                    for task_id in (done["taskId"], held["taskId"]):
                        theirs = await _error(bob_b, method, {"taskId": task_id})
                        never = await _error(bob_b, method, {"taskId": "cluster.never"})
                        assert json.dumps(theirs).replace(task_id, "T") == \
                            json.dumps(never).replace("cluster.never", "T"), (method, theirs, never)

                member_a.send_signal(signal.SIGKILL)
                await member_a.wait()
                # A new session at B, after A's death: the finished task answers, the unfinished one resumes on B
                again = await _peer(client, url_b, authority.mint(aud=url_b, sub="alice"))
                assert await _result(again, "tasks/result", {"taskId": done["taskId"]}) == on_a
                with trio.fail_after(90):
                    result = await _result(again, "tasks/result", {"taskId": held["taskId"]})
                assert "answered after the failover" in json.dumps(result["content"]), result
                assert (await _result(again, "tasks/get", {"taskId": held["taskId"]}))["status"] == "completed"
                owners = await _owners(store, held["taskId"])
                assert len(owners) == 2 and owners[0] == owner and _pid_of(owners[1]) != member_a.pid, owners


async def _asked(gw: Any, marker: str) -> bool:
    return any(marker in json.dumps(r.messages) for r in gw.requests)
