"""Composition end to end with real agentd processes on loopback (issue 5, "Composition").

Every agent here is a real ``python -m agentd``; their models are one scripted gateway in this process,
which tells the agents apart by the instruction marker in their user message and can hold a request open
(``wait``) until the test says so. The worker serves its self-MCP over HTTPS with mutual TLS
(certificates made with ``cryptography``); the parent declares it as ``reviewer`` through ``--config``.

(a), driving a worker's sync spawn over mTLS and over a bearer, is tests/selfmcp/test_composition.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.agents import agentd_worker, run_agentd, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.selfmcp.certs import Pki, make_pki

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

MARKERS = ("GRANDCHILD-TASK", "WORKER-TASK", "PARENT-TASK")


def role(request: RecordedRequest) -> str:
    user = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
    return next((marker for marker in MARKERS if marker in user), "?")


def tool_texts(request: RecordedRequest) -> list[str]:
    return [text_of(m.get("content")) for m in request.messages if m.get("role") == "tool"]


def worker_argv(pki: Pki, intelligence: str) -> list[str]:
    return ["--serve-mcp", "https://127.0.0.1:0", "--serve-cert", str(pki.server.cert), "--serve-key",
            str(pki.server.key), "--serve-client-ca", str(pki.ca), "--intelligence", intelligence,
            "--drain-timeout", "5"]


def parent_config(tmp_path: Path, pki: Pki, port: int) -> Path:
    config = tmp_path / "parent.yaml"
    config.write_text(
        "mcp_servers:\n"
        f"  - name: reviewer\n    url: https://127.0.0.1:{port}\n"
        f"    tls: {{ca: {pki.ca}, cert: {pki.client.cert}, key: {pki.client.key}}}\n"
    )
    return config


async def test_parent_agent_spawns_async_then_awaits_the_served_result(tmp_path: Path) -> None:
    """(b) The subscribe pattern driven by a parent *agent*: its model spawns on the worker with
    ``async: true``, then calls ``await_resource agent://subagent/served.1`` (subscribe, wake on
    ``notifications/resources/updated``, read) and gets the worker's terminal result."""
    pki = make_pki(tmp_path / "pki")
    worker_gate = trio.Event()
    uri = "agent://subagent/served.1"

    def reply(request: RecordedRequest) -> dict[str, Any]:
        who = role(request)
        if who == "WORKER-TASK":
            return text("WORKER-VERDICT: approve", wait=worker_gate)
        turn = len(tool_texts(request))
        if turn == 0:
            return tool_call("reviewer__subagent_spawn", {"instruction": "WORKER-TASK review", "async": True})
        if turn == 1:
            return tool_call("await_resource", {"uri": uri, "timeout_s": 60})
        return text("parent done", echo_last=True)

    async with scripted_gateway(default=reply) as gw:
        async with agentd_worker(worker_argv(pki, gw.url)) as worker:
            config = parent_config(tmp_path, pki, worker.port)
            argv = ["--config", str(config), "--mode", "loop", "--interval", "1h", "--intelligence", gw.url,
                    "--instruction", "PARENT-TASK: get a review", "--drain-timeout", "5"]
            async with agentd_worker(argv, serving=False) as parent:
                with trio.fail_after(60):
                    # The parent waits on the handle (subscribed, push delivery) before the worker finishes.
                    await parent.wait_event(lambda e: e.get("event") == "trigger.armed" and e.get("uri") == uri)
                    worker_gate.set()
                    answer = await parent.wait_event(lambda e: e.get("event") == "run.end" and "." in
                                                     str(e.get("run_id", "")))
                assert answer["status"] == "completed", answer
            assert parent.returncode == 0
    parents = [r for r in gw.requests if role(r) == "PARENT-TASK"]
    assert len(parents) == 3
    ack, awaited = tool_texts(parents[2])
    assert "served.1" in ack and "running" in ack
    body = json.loads(awaited[awaited.index("{"):]) if "{" in awaited else awaited
    assert "WORKER-VERDICT: approve" in json.dumps(body), awaited
    assert '"completed"' in json.dumps(body) and uri in awaited, awaited
    assert parent.result()["status"] == "completed"
    assert any(e.get("event") == "serve.updated" and e.get("uri") == uri for e in worker.events)


async def test_three_agents_parent_worker_and_the_workers_own_subagent(tmp_path: Path) -> None:
    """(c) parent agentd → worker agentd (its self-MCP, sync ``subagent.spawn``) → the served run delegates
    to its own subagent (``served.1.1``, one more process); the answer travels all the way back up."""
    pki = make_pki(tmp_path / "pki")

    def reply(request: RecordedRequest) -> dict[str, Any]:
        who, turn = role(request), len(tool_texts(request))
        if who == "GRANDCHILD-TASK":
            return text("GRANDCHILD-ANSWER 42")
        if who == "WORKER-TASK":
            if turn == 0:
                return tool_call("subagent_spawn", {"instruction": "GRANDCHILD-TASK compute"})
            return text("", echo_last=True)
        if turn == 0:
            return tool_call("reviewer__subagent_spawn", {"instruction": "WORKER-TASK delegate"})
        return text("", echo_last=True)

    async with scripted_gateway(default=reply) as gw:
        async with agentd_worker(worker_argv(pki, gw.url)) as worker:
            config = parent_config(tmp_path, pki, worker.port)
            done = await run_agentd(["--config", str(config), "--intelligence", gw.url,
                                     "--instruction", "PARENT-TASK: delegate twice"])
        assert worker.returncode == 0
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["status"] == "completed"
    assert "GRANDCHILD-ANSWER 42" in json.dumps(result["result"]), result
    served = [e for e in worker.events if e.get("event") == "serve.request" and e.get("tool") == "subagent.spawn"]
    assert [e["handle"] for e in served] == ["served.1"]
    assert sorted({role(r) for r in gw.requests}) == sorted(MARKERS)
    grand = [r for r in gw.requests if role(r) == "GRANDCHILD-TASK"]
    assert len(grand) == 1


async def test_parent_agent_drives_a_served_warm_session_and_reads_each_turn(tmp_path: Path) -> None:
    """A parent *agent* over mTLS: its model opens a warm session on the worker, sends it the next
    message (a sync ack), then ``await_resource`` on the handle until ``/turns`` passes 1 (subscribed: the
    worker notifies at the turn's end) and gets that turn's answer while the session stays open."""
    pki = make_pki(tmp_path / "pki")
    uri = "agent://subagent/served.1"

    def reply(request: RecordedRequest) -> dict[str, Any]:
        who = role(request)
        if who == "WORKER-TASK":
            users = [text_of(m.get("content")) for m in request.messages if m.get("role") == "user"]
            return text(f"WORKER-SAYS {users[-1].split()[-1]}")
        turn = len(tool_texts(request))
        if turn == 0:
            return tool_call("reviewer__subagent_spawn", {"instruction": "WORKER-TASK open", "warm": True})
        if turn == 1:
            return tool_call("reviewer__subagent_send", {"handle": "served.1", "message": "second"})
        if turn == 2:
            return tool_call("await_resource", {"uri": uri, "timeout_s": 60,
                                                "condition": {"pointer": "/turns", "op": "gt", "value": 1}})
        return text("parent done", echo_last=True)

    async with scripted_gateway(default=reply) as gw:
        async with agentd_worker(worker_argv(pki, gw.url)) as worker:
            config = parent_config(tmp_path, pki, worker.port)
            argv = ["--config", str(config), "--mode", "loop", "--interval", "1h", "--intelligence", gw.url,
                    "--instruction", "PARENT-TASK: talk to a warm reviewer", "--drain-timeout", "5"]
            async with agentd_worker(argv, serving=False) as parent:
                with trio.fail_after(60):
                    answer = await parent.wait_event(lambda e: e.get("event") == "run.end" and "." in
                                                     str(e.get("run_id", "")))
                assert answer["status"] == "completed", answer
            assert parent.returncode == 0
            # Still open on the worker after the parent's run: it waits for the next turn.
            assert not any(e.get("event") == "subagent.exit" for e in worker.events)
    parents = [r for r in gw.requests if role(r) == "PARENT-TASK"]
    assert len(parents) == 4
    ack, sent, awaited = tool_texts(parents[3])
    assert "awaiting_turn" in ack and "WORKER-SAYS open" in ack, ack
    assert "accepted" in sent, sent
    assert "WORKER-SAYS second" in awaited and '"turns":2' in awaited.replace(" ", ""), awaited
