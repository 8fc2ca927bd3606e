"""agentd against agentd over MCP Events: a reactive parent (``--on-event child:subagent.finished``) wakes when
a serving agentd's subagent finishes. The child is a real ``agentd`` process serving both wires; the spawn is made
over a 2025-11-25 session (as an orchestrator of the old wire would), the parent follows the event type on the
2026-07-28 wire by push (``events/stream``, which the child offers beside poll). Each side has its own scripted
gateway. SIGKILL of the child while the parent's stream is live: the parent re-opens the stream with its last
cursor once the child is back (its journal kept the log) and wakes for the run that ended meanwhile, once."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import trio

from agentd.config.model import EventSubscriptionConfig
from tests.integration.agents import agentd_worker
from tests.modes.live import config, live_daemon
from tests.modes.test_live import wake_prompts
from tests.peers.gateway import scripted_gateway, text
from tests.peers.launch import free_port
from tests.selfmcp.harness import LegacyPeer
from tests.waiting import until

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
                    await parent.events.wait_for("events.stream_active")  # its null cursor means "from now"
                    [armed] = parent.events.named("trigger.armed", trigger="event")
                    assert armed["delivery"] == "push", armed
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


HOLD = "HOLD: wait for the test"


async def test_the_parent_stream_survives_a_sigkilled_child_and_wakes_once_per_run(tmp_path: Path) -> None:
    finished = EventSubscriptionConfig("child", "subagent.finished")
    release = trio.Event()
    rules = [({"contains": HOLD}, text("held answer", wait=release))]
    async with scripted_gateway(rules=rules, default=text("first answer")) as child_gw, \
            scripted_gateway(default=text("noted")) as parent_gw:
        url = f"http://127.0.0.1:{free_port()}/mcp"
        argv = ["--serve-mcp", url, "--intelligence", child_gw.url, "--state-dir", str(tmp_path / "child"),
                "--drain-timeout", "3", "--cancel-grace", "1"]
        cfg = config(parent_gw.url, {"child": url}, on_events=(finished,),
                     instruction="When a child finishes, note its answer")
        async with httpx.AsyncClient(timeout=30) as client:
            async with agentd_worker(argv) as child, live_daemon(cfg, armed=0) as parent:
                with trio.fail_after(90):
                    await parent.events.wait_for("events.stream_active")
                    peer = LegacyPeer(client, child.url)
                    await peer.initialize()
                    first = await _spawn(peer, "say first")
                    await parent.events.wait_for("run.end", trigger="wake")
                    held = await _spawn(peer, HOLD)  # still running when the child dies
                    await until(lambda: any(HOLD in json.dumps(r.body) for r in child_gw.requests), timeout=60,
                                what="the held run's model request")
                    os.kill(child.pid, signal.SIGKILL)
                    await parent.events.wait_for("events.poll_failed")  # the stream broke
                    async with agentd_worker(argv):  # back on the same address, its journal read
                        release.set()  # the held run, resumed by the new child, ends: one event
                        await parent.events.wait_for("run.end", count=2, trigger="wake")
                        assert len(parent.events.named("events.stream_active")) >= 2  # re-opened
                await parent.stop()
        prompts = wake_prompts(parent_gw)
        assert len(prompts) == 2, prompts
        assert first in prompts[0] and "first answer" in prompts[0] and held not in prompts[0]
        assert held in prompts[1] and "held answer" in prompts[1] and first not in prompts[1]


async def _spawn(peer: LegacyPeer, instruction: str) -> str:
    answer = await peer.call("tools/call", {"name": "subagent.spawn", "arguments": {
        "instruction": instruction, "async": True}})
    return str(answer["result"]["structuredContent"]["handle"])
