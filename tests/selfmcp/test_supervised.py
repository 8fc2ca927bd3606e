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
