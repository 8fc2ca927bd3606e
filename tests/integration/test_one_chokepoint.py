"""One chokepoint per daemon: served spawns (Management origin) and the agent's own spawns (Stdio origin)
go through the daemon's ONE root supervisor, so ``--max-subagents`` counts both.

A real worker agentd serves its self-MCP on loopback with ``--max-subagents 1`` and runs its own
instruction against the scripted gateway (in this process, so the test holds each model request open
until it says so). The test drives the served side with agentd's own MCP client.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import agentd_worker, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

REFUSED = "spawn refused: max_subagents=1"


def _role(request: RecordedRequest) -> str:
    """Which agent sent a model request: the instruction marker in its user message."""
    user = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
    for marker in ("SERVED-TASK", "CHILD-TASK", "ROOT-TASK"):
        if marker in user:
            return marker
    return "?"


def _tool_texts(request: RecordedRequest) -> list[str]:
    return [text_of(m.get("content")) for m in request.messages if m.get("role") == "tool"]


async def _until(predicate: Any) -> None:
    """Poll a condition on external processes."""
    await until(predicate, timeout=120)


async def test_served_and_own_spawns_share_max_subagents() -> None:
    root_gate = [trio.Event(), trio.Event()]
    served_gate, child_gate = trio.Event(), trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        role = _role(request)
        if role == "SERVED-TASK":
            return text("served done", wait=served_gate)
        if role == "CHILD-TASK":
            return text("child done", wait=child_gate)
        turn = len(_tool_texts(request))
        if turn < 2:
            return tool_call("subagent_spawn", {"instruction": f"CHILD-TASK {turn + 1}"}, wait=root_gate[turn])
        return text("root done")

    async with scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--max-subagents", "1", "--intelligence", gw.url,
                "--instruction", "ROOT-TASK: delegate", "--drain-timeout", "5"]
        async with agentd_worker(argv) as worker:
            server = McpServerConfig(name="worker", url=worker.url)
            log = EventLog(sink=lambda line: None)
            with trio.fail_after(90):
                async with open_mcp_pool([server], log=log, secrets=SecretResolver(env={}), run_id="t") as pool:
                    roots = lambda: [r for r in gw.requests if _role(r) == "ROOT-TASK"]  # noqa: E731
                    await _until(lambda: len(roots()) >= 1)

                    # 1. A served run holds the only slot: the agent's own spawn is refused (isError).
                    ack = await pool.call_tool("worker", "subagent.spawn",
                                               {"instruction": "SERVED-TASK", "async": True})
                    assert ack.is_error is False and ack.structured["handle"] == "served.1"
                    uri = "agent://subagent/served.1"
                    assert await pool.subscribe(uri, server="worker") is True
                    root_gate[0].set()
                    await _until(lambda: len(roots()) >= 2)
                    observation = _tool_texts(roots()[1])[0]
                    assert REFUSED in observation and "at handle 0" in observation, observation
                    assert "error" in observation.lower()

                    # The served run ends and frees the slot.
                    served_gate.set()
                    update = await pool.updates().receive()
                    assert update.uri == uri

                    async def running() -> int:
                        status = await pool.read_resource("agent://status", server="worker")
                        return int(json.loads(status.contents[0]["text"])["spawns"]["running"])

                    async def none_running() -> bool:
                        return await running() == 0

                    await until(none_running, timeout=120, what="no spawn running")

                    # 2. The agent's own run holds the only slot: a served spawn is refused as isError.
                    root_gate[1].set()
                    await _until(lambda: any(_role(r) == "CHILD-TASK" for r in gw.requests))
                    refused = await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED-TASK 2"})
                    assert refused.is_error is True
                    assert REFUSED in text_of(refused.content), refused
                    child_gate.set()
                    await _until(lambda: len(roots()) >= 3)
                    assert "child done" in _tool_texts(roots()[2])[1]
        assert worker.returncode == 0
        result = worker.result()
        assert result["status"] == "completed" and result["result"] == "root done", result
        assert result["run_id"] == worker.run_id


async def test_a_daemon_wake_and_served_spawns_share_the_chokepoint() -> None:
    """The same in a daemon mode: a loop wake's subagent holds the only slot, a served spawn is refused."""
    hold = trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        role = _role(request)
        if role == "CHILD-TASK":
            return text("child done", wait=hold)
        if _tool_texts(request):
            return text("wake done")
        return tool_call("subagent_spawn", {"instruction": "CHILD-TASK"})

    async with scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--max-subagents", "1", "--intelligence", gw.url,
                "--mode", "loop", "--interval", "1h", "--instruction", "ROOT-TASK", "--drain-timeout", "5"]
        async with agentd_worker(argv) as worker:
            server = McpServerConfig(name="worker", url=worker.url)
            with trio.fail_after(60):
                async with open_mcp_pool([server], log=EventLog(sink=lambda line: None),
                                         secrets=SecretResolver(env={}), run_id="t") as pool:
                    await _until(lambda: any(_role(r) == "CHILD-TASK" for r in gw.requests))
                    refused = await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED-TASK"})
                    assert refused.is_error is True and REFUSED in text_of(refused.content), refused
                    hold.set()
                    await worker.wait_event(lambda e: e.get("event") == "run.end" and e.get("run_id", "").endswith(".1"))
                    ok = await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED-TASK",
                                                                           "async": True})
                    assert ok.is_error is False and ok.structured["handle"] == "served.1"
        assert worker.returncode == 0
