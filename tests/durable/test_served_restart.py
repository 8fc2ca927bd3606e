"""Served handles survive a SIGKILL of the daemon (``--serve-mcp`` with ``--state-dir``): the restarted daemon
answers ``subagent.status`` for them, an async run that was in flight is resumed from its child's journal (its
non-idempotent tool call in flight is reported to its model as unknown, not made again) and answers with its
finished result, and a peer that re-subscribes gets the terminal ``updated``; a warm session comes back idle with
its history, and the next ``subagent.send`` continues its conversation. New handles are numbered after the
journaled ones."""

from __future__ import annotations

import json
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
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

SLOW = "SLOW: charge order 9"


def _client(worker: Worker) -> Any:
    server = McpServerConfig(name="worker", url=worker.url)
    return open_mcp_pool([server], log=EventLog(sink=lambda line: None), secrets=SecretResolver(env={}),
                         run_id="test")


def reply(request: RecordedRequest) -> dict[str, Any]:
    said = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") in ("user", "assistant"))
    last = request.messages[-1] if request.messages else {}
    if SLOW in said:
        if last.get("role") == "tool":
            return text("charged")
        return tool_call("pay__charge", {"key": "order-9", "hold": "after"})  # executes, then hangs
    if "WARM-2" in said:
        return text("the number was 42" if "WARM-1" in said and "noted 42" in said else "no history")
    if "WARM-1" in said:
        return text("noted 42")
    return text("fine")


async def _structured(pool: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    answer = await pool.call_tool("worker", tool, arguments)
    assert answer.structured is not None, answer
    return dict(answer.structured)


async def test_served_handles_answer_after_a_sigkill_and_a_warm_session_continues(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp",
                "--state-dir", str(state), "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker:
            with trio.fail_after(60):
                async with _client(worker) as pool:
                    slow = await _structured(pool, "subagent.spawn", {"instruction": SLOW, "async": True})
                    warm = await _structured(pool, "subagent.spawn", {"instruction": "WARM-1: remember 42",
                                                                      "warm": True})
                    assert (slow["handle"], warm["handle"]) == ("served.1", "served.2")
                    assert warm["result"] == "noted 42" and warm["turns"] == 1, warm
                    await until(lambda: peer.count("charge") >= 1, timeout=90, what="the charge at the peer")
            os.kill(worker.pid, signal.SIGKILL)

        async with agentd_worker(argv) as worker:
            with trio.fail_after(90):
                async with _client(worker) as pool:
                    async def ended() -> dict[str, Any] | None:
                        view = await _structured(pool, "subagent.status", {"handle": "served.1"})
                        assert view["done"] or view["status"] == "running", view
                        return view if view["done"] else None

                    resumed = await until(ended, timeout=90, what="served.1 ended")
                    assert resumed["status"] == "completed" and resumed["result"] == "charged", resumed
                    unknown = [m for r in gw.requests for m in r.messages if m.get("role") == "tool"]
                    assert any("may or may not have run" in text_of(m.get("content")) for m in unknown), unknown
                    uri = "agent://subagent/served.1"
                    read = await pool.read_resource(uri, server="worker")
                    assert json.loads(read.contents[0]["text"])["status"] == "completed"
                    assert await pool.subscribe(uri, "worker")
                    updated = await pool.updates().receive()
                    assert updated.uri == uri

                    idle = await _structured(pool, "subagent.status", {"handle": "served.2"})
                    assert idle["status"] == "awaiting_turn" and idle["turns"] == 1, idle
                    sent = await _structured(pool, "subagent.send", {"handle": "served.2",
                                                                     "message": "WARM-2: which number?"})
                    assert sent["accepted"] is True, sent
                    async def answered() -> dict[str, Any] | None:
                        view = await _structured(pool, "subagent.status", {"handle": "served.2"})
                        if view.get("turns") == 2 and view["status"] == "awaiting_turn":
                            return view
                        assert not view["done"], view
                        return None

                    view = await until(answered, timeout=90, what="served.2's second turn")
                    assert view["result"] == "the number was 42", view

                    fresh = await _structured(pool, "subagent.spawn", {"instruction": "hello", "async": True})
                    assert fresh["handle"] not in ("served.1", "served.2")  # numbered after the journaled ones
        assert peer.count("charge") == 1 and len(peer.received) == 1  # the call in flight was not made again
