"""A served sync ``subagent.spawn`` in flight when the daemon is told to drain (SIGTERM) gets its final
answer before the listener stops: its result when the run finishes within the drain, else ``cancelled``.

A real worker agentd serves its self-MCP on loopback; the served child's model request is held open by
the scripted gateway (in this process) until the test says so.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import agentd_worker
from tests.peers.gateway import RecordedRequest, scripted_gateway, text

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

#: --drain-timeout 6 less the graces (1 + 0.5 + 1) and the answer margin (1): served runs get 2.5 s.
ARGV = ["--drain-timeout", "6", "--cancel-grace", "1", "--term-grace", "1"]


@pytest.mark.parametrize("finishes", [True, False], ids=["finishes-within-drain", "cancelled-by-drain"])
async def test_sigterm_drain_answers_the_sync_spawn_in_flight(finishes: bool) -> None:
    gate = trio.Event()
    asked = trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        asked.set()
        return text("served done", wait=gate)

    async with scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, *ARGV]
        async with agentd_worker(argv) as worker:
            server = McpServerConfig(name="worker", url=worker.url)
            log = EventLog(sink=lambda line: None)
            answers: list[Any] = []
            with trio.fail_after(60):
                async with open_mcp_pool([server], log=log, secrets=SecretResolver(env={}), run_id="t") as pool:

                    async def call() -> None:
                        answers.append(await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED"}))

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(call)
                        await asked.wait()  # the served child is mid-turn, the caller mid-call
                        worker.drain()
                        await worker.wait_event(lambda e: e.get("event") == "subagent.drain")
                        if finishes:
                            gate.set()
            gate.set()
        assert worker.returncode == 0
        names = [(e.get("event"), e.get("handle")) for e in worker.events]
        # The served run drained and ended while the listener still answered; only then did it stop.
        assert names.index(("subagent.drain", None)) < names.index(("subagent.exit", "served.1")) \
            < names.index(("serve.stop", None))
    assert len(answers) == 1
    answer = answers[0].structured
    if finishes:
        assert answers[0].is_error is False
        assert (answer["status"], answer["result"]) == ("completed", "served done"), answer
    else:
        assert answer["status"] == "cancelled" and answer["done"] is True, answer
