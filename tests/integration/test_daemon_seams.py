"""Seams of the daemon: the served ``agent://status`` carries the daemon's real run id (also when it was
generated), and a once-mode root run that ends while its worker keeps serving takes its own subagents
with it but leaves served runs alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.client.pool import McpPool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import Worker, agentd_worker, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

GENERATED = re.compile(r"^\d{8}T\d{6}Z-\d+-[0-9a-f]{6}$")


def _client(worker: Worker) -> Any:
    server = McpServerConfig(name="worker", url=worker.url)
    return open_mcp_pool([server], log=EventLog(sink=lambda line: None), secrets=SecretResolver(env={}),
                         run_id="test")


async def _status(pool: McpPool) -> dict[str, Any]:
    contents = await pool.read_resource("agent://status", server="worker")
    return dict(json.loads(contents.contents[0]["text"]))


async def test_status_run_id_is_the_generated_one_and_finds_the_daemon_mode() -> None:
    argv = ["--serve-mcp", "http://127.0.0.1:0", "--mode", "loop", "--interval", "1h", "--intelligence", "test",
            "--instruction", "tick"]
    async with agentd_worker(argv) as worker:
        with trio.fail_after(60):
            await worker.wait_event(lambda e: e.get("event") == "run.end" and "." in str(e.get("run_id")))
            async with _client(worker) as pool:
                status = await _status(pool)
    assert GENERATED.match(worker.run_id), worker.run_id
    assert status["run_id"] == worker.run_id
    assert status["mode"] == "loop"
    # Found by run id: the daemon mode's window (runs, subscriptions) is part of the served status.
    assert "reactive" in status and status["reactive"]["runs"] >= 1, status


async def test_root_run_end_cancels_its_own_subagents_not_served_ones() -> None:
    hold = trio.Event()  # never set: both subagents stay in their model call until cancelled

    def reply(request: RecordedRequest) -> dict[str, Any]:
        user = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        if "OWN-CHILD" in user or "SERVED-TASK" in user:
            return text("never", wait=hold)
        if not any(m.get("role") == "tool" for m in request.messages):
            return tool_call("subagent_spawn", {"instruction": "OWN-CHILD", "async": True})
        return text("root done")

    async with scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", gw.url, "--instruction", "ROOT",
                "--drain-timeout", "2", "--cancel-grace", "1"]
        async with agentd_worker(argv, stop_timeout=40) as worker:
            with trio.fail_after(60):
                async with _client(worker) as pool:
                    ack = await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED-TASK",
                                                                            "async": True})
                    assert ack.structured["handle"] == "served.1"
                    end = await worker.wait_event(lambda e: e.get("event") == "run.end")
                    assert end["status"] == "completed"
                    exited = await worker.wait_event(lambda e: e.get("event") == "subagent.exit")
                    assert exited["handle"] == "0.1" and exited["status"] == "cancelled", exited
                    status = await _status(pool)
                    assert status["spawns"]["running"] == 1  # served.1 is still running
                    view = await pool.call_tool("worker", "subagent.status", {"handle": "served.1"})
                    assert view.structured["status"] == "running"
        assert worker.returncode == 0  # the drain cancelled served.1 at --drain-timeout: still exit 0
    assert len(gw.requests) >= 3
