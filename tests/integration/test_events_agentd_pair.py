"""agentd against agentd over MCP Events: a reactive parent (``--on-event child:subagent.finished``) wakes when
a serving agentd's subagent finishes, without a connection held open for it. The child is a real ``agentd``
process serving both wires; the spawn is made over a 2025-11-25 session (as an orchestrator of the old wire
would), the parent polls on the 2026-07-28 wire. Each side has its own scripted gateway."""

from __future__ import annotations

import httpx
import pytest
import trio

from agentd.config.model import EventSubscriptionConfig
from tests.integration.agents import agentd_worker
from tests.peers.gateway import scripted_gateway, text
from tests.reactive.live import config, live_daemon
from tests.reactive.test_live import wake_prompts
from tests.selfmcp.harness import LegacyPeer

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]


async def test_a_parent_wakes_when_a_served_subagent_finishes() -> None:
    finished = EventSubscriptionConfig("child", "subagent.finished")
    async with scripted_gateway(default=text("child says 42")) as child_gw, \
            scripted_gateway(default=text("noted")) as parent_gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", child_gw.url]
        async with agentd_worker(argv) as child, httpx.AsyncClient(timeout=30) as client:
            cfg = config(parent_gw.url, {"child": child.url}, on_events=(finished,),
                         instruction="When a child finishes, note its answer")
            async with live_daemon(cfg, armed=0) as parent:
                with trio.fail_after(60):
                    await parent.events.wait_for("events.polled")  # its null cursor means "from now"
                    peer = LegacyPeer(client, child.url)
                    await peer.initialize()
                    answer = await peer.call("tools/call", {"name": "subagent.spawn", "arguments": {
                        "instruction": "answer with a number", "async": True}})
                    handle = answer["result"]["structuredContent"]["handle"]
                    await parent.events.wait_for("run.end", trigger="wake")
                await parent.stop()
        [prompt] = wake_prompts(parent_gw)
        assert 'Event "subagent.finished" on server "child"' in prompt
        assert handle in prompt and "completed" in prompt and "child says 42" in prompt
