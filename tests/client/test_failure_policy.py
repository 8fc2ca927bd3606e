"""The retry/abort policy (agentd.mcp.failure_policy), one row at a time, against a real misbehaving server
(tests/client/fakeserver.py on a real socket): what is re-sent, what is not, and what reaches the model.

The request counts come from the server's own log, so "never re-sent" means the server saw it once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentd.agent.budgets import Limits
from agentd.agent.result import RunStatus
from agentd.agent.runner import RunRequest
from agentd.client import Tuning, open_mcp_pool
from agentd.errors import McpProtocolError, McpRpcError, McpTransportError, ResourceNotFound
from agentd.run import run_with
from agentd.telemetry.events import EventLog
from tests.agent.scripted import ScriptedModel, call, final, tools_reply
from tests.client.fakeserver import FakeServer, Req, Resp, error, mcp_answer, result, serve_fake
from tests.client.helpers import Events, server

TUNING = Tuning(backoff_initial=0.05, backoff_max=0.2)
TOOLS = [{"name": "t", "inputSchema": {"type": "object"}},
         {"name": "same", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": True}}]


def _script(misbehave: dict[str, Any]) -> Any:
    """A legacy server listing ``t`` and ``same`` (idempotent); ``misbehave[method]`` (a list, one entry per
    request, consumed in order) breaks that request: ``"abort"``, ``"hang"``, ``"garbage"`` or a JSON-RPC code."""

    async def handler(req: Req, resp: Resp) -> None:
        method = req.rpc_method
        plan = misbehave.get(method or "")
        how = plan.pop(0) if plan else None
        if how == "abort":
            await resp.abort()
        elif how == "hang":
            await trio.sleep_forever()
        elif how == "garbage":
            await resp.body(200, b"this is not JSON-RPC")
        elif isinstance(how, int):
            await resp.json(error(req, how, "scripted failure", {"uri": "r://x"} if how == -32002 else None))
        elif method == "tools/list":
            await resp.json(result(req, {"tools": TOOLS}))
        else:
            await mcp_answer(req, resp)

    return handler


def _count(fake: FakeServer, method: str) -> int:
    return fake.methods().count(method)


async def _with_fake(misbehave: dict[str, Any], body: Any, **options: Any) -> tuple[FakeServer, Events]:
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, _script(misbehave))
        async with open_mcp_pool([server(fake.url, **options)], log=events.log, tuning=TUNING) as pool:
            with trio.fail_after(20):
                await body(pool)
        nursery.cancel_scope.cancel()
    return fake, events


async def test_broken_safe_request_is_retried() -> None:
    async def body(pool: Any) -> None:
        read = await pool.read_resource("r://x", server="s")
        assert read.contents[0]["text"] == "x"

    fake, events = await _with_fake({"resources/read": ["abort"]}, body)
    assert _count(fake, "resources/read") == 2
    (retry,) = events.named("mcp.retry")
    assert (retry["method"], retry["failure"], retry["attempt"]) == ("resources/read", "broken", 2)


async def test_broken_safe_request_gives_up_after_the_bounded_retries() -> None:
    async def body(pool: Any) -> None:
        with pytest.raises(McpTransportError):
            await pool.read_resource("r://x", server="s")

    fake, events = await _with_fake({"resources/read": ["abort"] * 5}, body)
    assert _count(fake, "resources/read") == 3  # the first send and RETRIES=2 more
    assert len(events.named("mcp.retry")) == 2


@pytest.mark.parametrize("tool", ["t", "same"])
async def test_a_tools_call_that_broke_after_sending_is_never_resent(tool: str) -> None:
    async def body(pool: Any) -> None:
        with pytest.raises(McpTransportError) as info:
            await pool.call_tool("s", tool, {})
        assert not info.value.unsent

    fake, events = await _with_fake({"tools/call": ["abort"]}, body)
    assert _count(fake, "tools/call") == 1 and events.named("mcp.retry") == []


@pytest.mark.parametrize("tool, sent", [("same", 1), ("t", 0)])
async def test_an_unsent_tools_call_is_resent_only_when_idempotent(tool: str, sent: int) -> None:
    """The server goes away (connection refused), comes back on the same port: an idempotent call that never
    reached it is sent to the new one; any other call is not."""
    events = Events()
    async with trio.open_nursery() as nursery:
        first = await nursery.start(serve_fake, _script({}))
        port = int(first.url.rsplit(":", 1)[1].split("/")[0])
        async with open_mcp_pool([server(first.url)], log=events.log, tuning=TUNING) as pool:
            first.stop()
            await trio.sleep(0.05)  # real time: the fake server's listener closes in its own task

            async def come_back() -> None:
                await trio.sleep(0.1)  # real time: the call's first try finds the port closed
                nursery.start_soon(serve_fake, _script({}), port)

            with trio.fail_after(20):
                pool.connections["s"].liveness.mark_broken("test: the server went away")
                nursery.start_soon(come_back)
                if sent:
                    assert (await pool.call_tool("s", tool, {})).content[0]["text"] == "ok"
                else:
                    with pytest.raises(McpTransportError) as info:
                        await pool.call_tool("s", tool, {})
                    assert info.value.unsent
        nursery.cancel_scope.cancel()
    assert _count(first, "tools/call") == 0
    retries = events.named("mcp.retry")
    assert bool(retries) is bool(sent) and all(r["failure"] == "unsent" for r in retries)


@pytest.mark.parametrize("misbehave, raised, method", [
    ("hang", McpTransportError, "tools/call"),       # timeout
    (-32603, McpRpcError, "tools/call"),             # other JSON-RPC error
    ("garbage", McpProtocolError, "tools/call"),     # protocol
    (-32603, McpRpcError, "resources/read"),         # an RPC error on a safe request is not retried either
    (-32002, ResourceNotFound, "resources/read"),    # not found: an observation
    (-32601, McpRpcError, "tools/call"),             # correctable (the loop tells the model)
    (-32602, McpRpcError, "tools/call"),
])
async def test_answered_failures_are_never_resent(misbehave: Any, raised: type, method: str) -> None:
    async def body(pool: Any) -> None:
        with pytest.raises(raised):
            if method == "tools/call":
                await pool.call_tool("s", "same", {})
            else:
                await pool.read_resource("r://x", server="s")

    fake, events = await _with_fake({method: [misbehave]}, body, call_timeout=0.5)
    assert _count(fake, method) == 1 and events.named("mcp.retry") == []


async def test_refused_by_agentd_is_never_sent() -> None:
    async def body(pool: Any) -> None:
        with pytest.raises(Exception, match="allowlist"):
            await pool.call_tool("s", "same", {})

    fake, _ = await _with_fake({}, body, tools=("t",))
    assert _count(fake, "tools/call") == 0


# --- through the loop: what the model sees, and a server that keeps failing ----------------------------------


async def _loop(misbehave: dict[str, Any], script: list[Any], *, required: bool = True,
                ) -> tuple[Any, FakeServer, list[dict[str, Any]], ScriptedModel]:
    lines: list[dict[str, Any]] = []
    log = EventLog(sink=lines.append, run_id="run-1")
    model = ScriptedModel(script)
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, _script(misbehave))
        servers = [server(fake.url, "s", required=required, call_timeout=0.5)]
        async with open_mcp_pool(servers, log=log, tuning=TUNING) as pool:
            with trio.fail_after(30):
                outcome = await run_with(RunRequest("go", "run-1", Limits(max_steps=10)), pool=pool, intel=model,
                                         log=log)
        nursery.cancel_scope.cancel()
    return outcome, fake, lines, model


def _observations(model: ScriptedModel) -> list[str]:
    return [m["content"] for m in model.requests[-1][0] if m["role"] == "tool"]


@pytest.mark.parametrize("code", [-32601, -32602])
async def test_unknown_tool_or_bad_params_is_a_correctable_protocol_error(code: int) -> None:
    script = [tools_reply(call("s__t", {})), tools_reply(call("s__t", {})), tools_reply(call("s__t", {})),
              tools_reply(call("s__t", {})), final("fixed")]
    outcome, fake, lines, model = await _loop({"tools/call": [code] * 4}, script)
    assert outcome.status is RunStatus.COMPLETED  # four in a row: never a fault streak, never "down"
    assert _count(fake, "tools/call") == 4  # each told once, none re-sent
    first = _observations(model)[0]
    assert "refused this call to 't' as a protocol error" in first and f"JSON-RPC error {code}" in first
    kinds = [line["kind"] for line in lines if line["event"] == "tool.result"]
    assert kinds == ["protocol_error"] * 4
    assert not [line for line in lines if line["event"] == "mcp.server_down"]


async def test_a_required_server_that_keeps_failing_is_down_exit_6() -> None:
    script = [tools_reply(call("s__t", {}))] * 5 + [final("never")]
    outcome, fake, lines, _ = await _loop({"tools/call": [-32603, "abort", "hang"]}, script)
    assert outcome.status is RunStatus.MCP_FAILED and outcome.exit_code == 6
    assert _count(fake, "tools/call") == 3
    (down,) = [line for line in lines if line["event"] == "mcp.server_down"]
    assert (down["server"], down["required"], down["failures"], down["failure"]) == ("s", True, 3, "timeout")
    assert "required MCP server 's' is down" in (outcome.error or "")
    assert json.loads(json.dumps(outcome.to_json()))["status"] == "mcp_failed"


async def test_an_optional_server_that_keeps_failing_is_omitted() -> None:
    script = [tools_reply(call("s__t", {}))] * 3 + [tools_reply(call("s__t", {})), final("carried on")]
    outcome, fake, lines, model = await _loop({"tools/call": [-32603] * 3}, script, required=False)
    assert outcome.status is RunStatus.COMPLETED and outcome.result == "carried on"
    (down,) = [line for line in lines if line["event"] == "mcp.server_down"]
    assert down["required"] is False
    assert _count(fake, "tools/call") == 3  # the fourth call names a tool no longer offered: rejected, not sent
    offered = [{t.name for t in tools} for _, tools in model.requests]
    assert "s__t" in offered[0] and "s__t" not in offered[-1]
