"""The served surface over the real supervisor (re-exec'd children running scripted turns)."""

from __future__ import annotations

import json

import pytest
import trio

from agentd.mcp.jsonrpc import Request
from agentd.mcp.versions import Era
from agentd.selfmcp.supervised import SupervisorBackend
from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
from agentd.supervisor.supervisor import open_supervisor
from agentd.transport.asgi_server import CallContext
from tests.waiting import until

pytestmark = pytest.mark.slow


def _script(request: object, handle: str) -> dict:
    instruction = getattr(request, "instruction", "")
    if instruction.startswith("{"):
        return json.loads(instruction)
    return {"steps": [["echo"]]}


async def _call(surface: SelfMcpSurface, name: str, arguments: dict) -> dict:
    ctx = CallContext(Era.LEGACY, "s", lambda uri: None)
    reply = await surface.handle(Request(1, "tools/call", {"name": name, "arguments": arguments}), ctx)
    return reply.result  # type: ignore[union-attr]


async def test_spawn_warm_send_cancel_and_refusal_through_the_chokepoint() -> None:
    with trio.fail_after(60):
        async with open_supervisor(test_script=_script) as sup, trio.open_nursery() as nursery:
            surface = SelfMcpSurface(SupervisorBackend(sup), AgentInfo("r", "loop"))
            await nursery.start(surface.run)
            sync = await _call(surface, "subagent.spawn", {"instruction": "hello"})
            assert sync["isError"] is False
            assert sync["structuredContent"]["handle"] == "served.1"
            assert sync["structuredContent"]["status"] == "completed"
            warm = await _call(surface, "subagent.spawn", {"instruction": "first", "warm": True})
            handle = warm["structuredContent"]["handle"]
            assert handle.startswith("served.")
            sent = await _call(surface, "subagent.send", {"handle": handle, "message": "second"})
            assert sent["structuredContent"] == {"handle": handle, "accepted": True}
            cancelled = await _call(surface, "subagent.cancel", {"handle": handle})
            assert cancelled["structuredContent"]["done"] is True
            scoped = await _call(surface, "subagent.spawn", {"instruction": "x", "tool_scope": ["nope"]})
            assert scoped["isError"] is True  # narrowing: this agent has no server "nope"
            status = await _call(surface, "status", {})
            assert status["structuredContent"]["spawns"]["spawned"] == 2
            nursery.cancel_scope.cancel()


async def test_refusals_carry_a_retry_hint_and_are_counted_by_cap() -> None:
    from agentd.selfmcp.surface import SelfMcpLimits
    from agentd.supervisor.caps import Caps
    from agentd.supervisor.supervisor import SupervisorSettings

    hang = json.dumps({"steps": [["hang"]]})
    settings = SupervisorSettings(caps=Caps(max_subagents=2))
    with trio.fail_after(60):
        async with open_supervisor(test_script=_script, settings=settings) as sup, trio.open_nursery() as nursery:
            surface = SelfMcpSurface(SupervisorBackend(sup), AgentInfo("r", "loop"),
                                     limits=SelfMcpLimits(max_concurrent_spawns=2, max_warm=1))
            await nursery.start(surface.run)
            scoped = await _call(surface, "subagent.spawn", {"instruction": "x", "tool_scope": ["nope"]})
            assert scoped["isError"] is True
            assert scoped["structuredContent"] == {"handle": "", "status": "refused", "done": True,
                                                   "refused": "tool_scope", "retryable": False, "retry_after_s": None}
            for _ in range(2):
                ack = await _call(surface, "subagent.spawn", {"instruction": hang, "async": True})
                assert ack["isError"] is False
            over = await _call(surface, "subagent.spawn", {"instruction": hang, "async": True})
            assert over["isError"] is True and "2 served spawns already running" in over["content"][0]["text"]
            assert over["structuredContent"] == {"handle": "", "status": "refused", "done": True,
                                                 "refused": "serve_max_spawns", "retryable": True, "retry_after_s": 1.0}
            # The supervisor's own cap (two subagents live) refuses the warm spawn the surface let through.
            warm = await _call(surface, "subagent.spawn", {"instruction": hang, "warm": True})
            assert warm["isError"] is True and "max_subagents=2" in warm["content"][0]["text"]
            assert warm["structuredContent"]["refused"] == "max_subagents"
            assert warm["structuredContent"]["retryable"] is True
            status = await _call(surface, "status", {})
            assert status["structuredContent"]["spawns"]["refused"] == 3
            assert status["structuredContent"]["refusals"] == {"max_subagents": 1, "serve_max_spawns": 1,
                                                               "tool_scope": 1}
            nursery.cancel_scope.cancel()


async def test_retention_evicts_the_run_from_the_supervisor_too() -> None:
    from agentd.selfmcp.surface import SelfMcpLimits

    with trio.fail_after(60):
        async with open_supervisor(test_script=_script) as sup, trio.open_nursery() as nursery:
            surface = SelfMcpSurface(SupervisorBackend(sup), AgentInfo("r", "loop"),
                                     limits=SelfMcpLimits(retention=0.0))
            await nursery.start(surface.run)
            handles = []
            for _ in range(3):
                done = await _call(surface, "subagent.spawn", {"instruction": "hello"})
                assert done["structuredContent"]["status"] == "completed"
                handles.append(done["structuredContent"]["handle"])
            # retention 0: each watcher evicts right after the terminal status
            await until(lambda: not surface.runs, timeout=30, what="the runs evicted")
            assert not any(sup.statistics().node(h) for h in handles)
            nursery.cancel_scope.cancel()
