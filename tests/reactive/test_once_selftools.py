"""The ``subscribe`` self-tool in a once run (through the real command line): not offered, so a model that
calls it anyway gets a clear ``isError`` observation naming what is offered, the run goes on and completes,
and the process ends (once stays once: nothing is queued, nothing keeps it up)."""

from __future__ import annotations

import json

import pytest

from tests.integration.agents import run_agentd, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = pytest.mark.usefixtures("no_leftover_children")


async def test_subscribe_in_a_once_run_is_refused_clearly_and_the_run_completes() -> None:
    def reply(request: RecordedRequest) -> dict:
        tools = [m for m in request.messages if m.get("role") == "tool"]
        if not tools:
            return tool_call("subscribe", {"uri": "file:///inbox"})
        return text("observed: " + text_of(tools[-1].get("content")))

    async with scripted_gateway(default=reply) as gw:
        done = await run_agentd(["--instruction", "watch the inbox", "--intelligence", gw.url], timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout.decode())
    assert result["status"] == "completed"
    assert "subscribe" not in [t for r in gw.requests for t in r.tool_names]
    assert "unknown tool 'subscribe'" in result["result"], result
