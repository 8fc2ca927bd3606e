"""Every served handle answers after a SIGKILL of the daemon, repeatedly (``--serve-mcp`` with ``--state-dir``):
async runs in flight resume from their children's journals and answer with their finished results, their
non-idempotent calls in flight made once at most (counted at a real MCP server); a warm session whose turn was
in flight comes back idle and says that turn was lost. ``AGENTD_CRASH_REPEAT`` rounds (default 3)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.durable.peer import counting_peer
from tests.integration.agents import Worker, agentd_worker, text_of
from tests.peers.gateway import RecordedRequest, ScriptedGateway, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

REPEAT = int(os.environ.get("AGENTD_CRASH_REPEAT", "3"))
HOLDS = {"a": "after", "b": "before"}


def _client(worker: Worker) -> Any:
    server = McpServerConfig(name="worker", url=worker.url)
    return open_mcp_pool([server], log=EventLog(sink=lambda line: None), secrets=SecretResolver(env={}),
                         run_id="test")


async def _structured(pool: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    answer = await pool.call_tool("worker", tool, arguments)
    assert answer.structured is not None, answer
    return dict(answer.structured)


def _reply(never: trio.Event) -> Any:
    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        last = request.messages[-1] if request.messages else {}
        for key, hold in HOLDS.items():
            if f"SLOW-{key}" in said:
                if last.get("role") == "tool":
                    return text(f"{key}: {text_of(last.get('content'))}")
                return tool_call("pay__charge", {"key": key, "hold": hold})
        if "WARM-HANG" in said:
            return text("never", wait=never)
        return text("noted")

    return reply


async def test_every_served_handle_answers_after_repeated_sigkills(tmp_path: Path) -> None:
    for attempt in range(REPEAT):
        state, never = tmp_path / f"state-{attempt}", trio.Event()
        async with counting_peer() as peer, scripted_gateway(default=_reply(never)) as gw:
            argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", gw.url, "--mcp",
                    f"pay={peer.origin}/mcp", "--state-dir", str(state), "--drain-timeout", "3", "--cancel-grace", "1"]
            async with agentd_worker(argv) as worker:
                with trio.fail_after(60):
                    async with _client(worker) as pool:
                        handles = {key: (await _structured(pool, "subagent.spawn", {
                            "instruction": f"SLOW-{key}: charge {key}", "async": True}))["handle"] for key in HOLDS}
                        warm = await _structured(pool, "subagent.spawn", {"instruction": "WARM: hello", "warm": True})
                        assert warm["result"] == "noted", warm
                        sent = await _structured(pool, "subagent.send", {"handle": warm["handle"],
                                                                         "message": "WARM-HANG: and now?"})
                        assert sent["accepted"] is True, sent
                        def in_flight(gw: ScriptedGateway = gw) -> bool:
                            return len(peer.received) >= 2 and any("WARM-HANG" in str(r.messages)
                                                                   for r in gw.requests)

                        await until(in_flight, timeout=90, what="both charges and the warm session's model call")
                os.kill(worker.pid, signal.SIGKILL)

            async with agentd_worker(argv) as worker:
                with trio.fail_after(90):
                    async with _client(worker) as pool:
                        for key, handle in handles.items():
                            async def ended(handle: str = handle) -> dict[str, Any] | None:
                                view = await _structured(pool, "subagent.status", {"handle": handle})
                                return view if view["done"] else None

                            view = await until(ended, timeout=90, what=f"{handle} ended")
                            assert view["status"] == "completed" and str(view["result"]).startswith(f"{key}: "), view
                            if HOLDS[key] == "before":
                                assert "may or may not have run" in view["result"], view
                        idle = await _structured(pool, "subagent.status", {"handle": warm["handle"]})
                        assert idle["status"] == "awaiting_turn" and not idle["done"], idle
                        assert "that turn was lost" in str(idle["result"]), idle
            assert sorted(c["key"] for c in peer.received) == ["a", "b"], peer.received  # no call made twice
            assert peer.count("charge") == 1  # "a" took effect before the kill, "b" never did
            del gw
