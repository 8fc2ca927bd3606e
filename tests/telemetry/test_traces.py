"""One trace across a whole run tree: the root process, two levels of subagent processes, the MCP server.

Real parts only: ``python -m agentd --otel`` as the root, its children forked by the real supervisor, a
scripted gateway and a fake MCP server in this trio run, and an OTLP/HTTP receiver decoding what every
process exported.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import trio

from tests.client.fakeserver import Req, Resp, mcp_answer, result, serve_fake
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.telemetry.otlp import otlp_receiver

ROOT = Path(__file__).resolve().parents[2]
HARNESS_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HARNESS_SPAN = "00f067aa0ba902b7"
SECRET = "tok-SECRET-9f8e7d6c"
CONTENT = "CONTENT-MARKER-root-task"
ARGUMENT = "ARG-MARKER-1234"


def _decide(request: Any) -> dict[str, Any]:
    """root → spawn a child; child → spawn a grandchild; grandchild → call the MCP tool; then answer."""
    last = request.messages[-1]
    if last.get("role") == "tool":
        return text(json.dumps({"done": True}))
    said = " ".join(str(m.get("content")) for m in request.messages if m.get("role") == "user")
    names = [t["function"]["name"] for t in request.body.get("tools", [])]
    if "grandchild task" in said:
        return tool_call(next(n for n in names if n.endswith("echo")), {"text": ARGUMENT})
    spawn = next(n for n in names if n.startswith("subagent") and n.endswith("spawn"))
    if "child task" in said:
        return tool_call(spawn, {"instruction": "grandchild task"})
    return tool_call(spawn, {"instruction": "child task"})


async def _mcp(req: Req, resp: Resp) -> None:
    if req.rpc_method == "tools/list":
        await resp.json(result(req, {"tools": [{
            "name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}]}))
    elif req.rpc_method == "tools/call":
        await resp.json(result(req, {"content": [{"type": "text", "text": "echoed"}], "isError": False}))
    else:
        await mcp_answer(req, resp)


async def _run_tree(receiver_url: str, gw_url: str, mcp_url: str, *extra: str) -> tuple[int, bytes, bytes]:
    env = {**os.environ, "GW_TOKEN": SECRET, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url,
           "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_SERVICE_NAME": "agentd-test"}
    env.pop("TRACEPARENT", None)
    argv = [sys.executable, "-m", "agentd", "--instruction", f"{CONTENT}: delegate", "--intelligence", gw_url,
            "--intelligence-token", "{{secret:GW_TOKEN}}", "--mcp", f"fix={mcp_url}", "--otel", *extra]
    done = await trio.run_process(argv, cwd=ROOT, env=env, capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stdout, done.stderr


async def test_one_trace_across_root_children_and_the_mcp_server():
    async with otlp_receiver() as receiver, scripted_gateway(default=_decide) as gw, trio.open_nursery() as n:
        mcp = await n.start(serve_fake, _mcp)
        with trio.fail_after(90):
            code, out, err = await _run_tree(receiver.url, gw.url, mcp.url,
                                             "--traceparent", f"00-{HARNESS_TRACE}-{HARNESS_SPAN}-01")
        mcp.stop()
    assert code == 0, (out, err[-3000:])
    assert json.loads(out)["status"] == "completed"
    spans = receiver.spans
    by_id = receiver.by_id()
    # one trace, the harness's own
    assert spans and {s.trace_id for s in spans} == {HARNESS_TRACE}
    agents = sorted(receiver.named("invoke_agent"), key=lambda s: len(s.attributes["agentd.agent.path"]))
    assert [a.attributes["agentd.agent.path"] for a in agents] == ["0", "0.1", "0.1.1"]
    root, child, grandchild = agents
    # three processes
    assert len({root.pid, child.pid, grandchild.pid}) == 3
    # the root's parent is the harness span; each child's parent is its parent's execute_tool span
    assert root.parent_span_id == HARNESS_SPAN
    for parent, kid in ((root, child), (child, grandchild)):
        spawn = by_id[kid.parent_span_id]
        assert spawn.name.startswith("execute_tool subagent"), spawn.name
        assert spawn.attributes["gen_ai.operation.name"] == "execute_tool"
        assert spawn.resource["process.pid"] == parent.pid
        # the spawning tool span sits under the parent's invoke_agent span
        assert by_id[spawn.parent_span_id].span_id == parent.span_id
    # the grandchild's tool call: execute_tool echo -> tools/call echo (client) -> the MCP server got its id
    call = next(s for s in receiver.named("tools/call echo") if s.pid == grandchild.pid)
    assert call.kind == 3  # SPAN_KIND_CLIENT
    assert call.attributes["mcp.method.name"] == "tools/call"
    assert call.attributes["gen_ai.tool.name"] == "echo"
    assert call.attributes["jsonrpc.request.id"]
    assert by_id[call.parent_span_id].name == "execute_tool echo"
    calls = [r for r in mcp.requests if r.rpc_method == "tools/call"]
    assert len(calls) == 1
    traceparent = calls[0].json["params"]["_meta"]["traceparent"]
    assert traceparent.split("-")[1:3] == [HARNESS_TRACE, call.span_id]
    # every gateway request carried the trace context of a chat span of the same trace
    chats = {s.span_id: s for s in receiver.named("chat ")}
    for request in gw.requests:
        _, trace_id, span_id, _ = request.headers["traceparent"].split("-")
        assert trace_id == HARNESS_TRACE and span_id in chats
    for chat in chats.values():
        assert chat.kind == 3
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert "gen_ai.usage.input_tokens" in chat.attributes
    # every JSON line of the root carries the ids of the trace
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    traced = [line for line in lines if line.get("event") in ("loop.step", "tool.call", "run.start")]
    assert traced and all(line.get("trace_id") == HARNESS_TRACE and len(line.get("span_id", "")) == 16
                          for line in traced)
    # no secret and no content on any span, in any process, by default
    for body in receiver.bodies:
        for marker in (SECRET, CONTENT, ARGUMENT, "grandchild task"):
            assert marker.encode() not in body, marker
