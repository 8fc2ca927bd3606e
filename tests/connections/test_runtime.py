"""Runtime modules (application tools, errors, exceptions, authorize callbacks), limits, timeouts, steps."""

from __future__ import annotations

import trio

from tests.connections.helpers import connection, run, write
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call, tool_calls

RUNTIME = """
import trio

tools = [
    {
        "name": "lookup_status",
        "description": "Look up a shipment status.",
        "inputSchema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["trackingNumber"],
            "properties": {"trackingNumber": {"type": "string"}},
        },
    },
    {"name": "explode", "description": "Always raises.", "inputSchema": {"type": "object"}},
]


class Adapter:
    async def list_tools(self):
        return tools

    async def execute_tool(self, call, context):
        if call.name == "explode":
            raise RuntimeError("the warehouse is on fire")
        if call.input["trackingNumber"] == "unknown":
            return {"callId": call.id, "name": call.name,
                    "error": {"code": "NOT_FOUND", "message": "No such shipment."}}
        await trio.sleep(0)  # coroutines run on trio
        assert not context.cancel_scope.cancel_called
        return {"callId": call.id, "name": call.name,
                "output": {"status": "in transit", "tracking": call.input["trackingNumber"],
                           "user": context.user, "tenant": context.tenant}}


tool_adapter = Adapter()


def authorize_tool(request):
    if request["tool"] == "read" or request.input.get("trackingNumber") == "forbidden":
        return {"allowed": False, "reason": f"{request['user']} may not do that"}
    return True
"""


def host_for(gw, peer, **extra):
    return {
        "intelligence": {"url": gw.url},
        "connections": {
            "docs": connection(
                f"{peer.origin}/mcp",
                mode="read_write",
                tools=["search", "read", "slow"],
                readTools=["search", "read"],
                **extra,
            )
        },
        "transcript": {"enabled": False},
    }


def manifest(tools, **extra):
    return {
        "connections": [{"ref": "docs", "alias": "docs"}],
        "steps": [{"id": "s", "type": "prompt", "prompt": "p", "tools": tools}],
        **extra,
    }


def observations(request):
    return [m["content"] for m in request.messages if m["role"] == "tool"]


async def test_application_tools_results_errors_and_authorize(tmp_path):
    module = str(write(tmp_path, "runtime.py", RUNTIME))
    script = [
        tool_calls(
            ("lookup_status", {"trackingNumber": "A1"}),
            ("lookup_status", {"trackingNumber": "unknown"}),
            ("lookup_status", {"trackingNumber": "forbidden"}),
            ("docs__read", {"id": "1"}),
            ("docs__search", {"q": "ok"}),
        ),
        text("done"),
    ]
    async with mcp_peer() as peer, scripted_gateway(script) as gw:
        with trio.fail_after(20):
            outcome = await run(
                tmp_path,
                host_for(gw, peer),
                manifest(["lookup_status", "docs__search", "docs__read"]),
                args=["--runtime-module", module, "--user", "alice", "--tenant", "acme"],
            )
    assert outcome.code == 0, outcome.raw
    assert sorted(gw.requests[0].tool_names) == ["docs__read", "docs__search", "lookup_status"]
    seen = observations(gw.requests[1])
    assert "in transit" in seen[0] and "alice" in seen[0] and "acme" in seen[0]
    assert "NOT_FOUND: No such shipment." in seen[1]
    assert "denied by host policy: alice may not do that" in seen[2]
    assert "denied by host policy" in seen[3]
    assert "search" in seen[4]
    assert peer.calls == [{"name": "search", "arguments": {"q": "ok"}}]  # the denied read never left agentd
    outcomes = [e["outcome"] for e in outcome.named("model.tool.completed")]
    assert outcomes == ["ok", "error", "denied", "denied", "ok"]
    # "slow" is allowlisted and listed; nothing is missing on this server
    assert not outcome.named("config.warning")


async def test_application_tool_exception_fails_the_step(tmp_path):
    module = str(write(tmp_path, "runtime.py", RUNTIME))
    async with mcp_peer() as peer, scripted_gateway([tool_call("explode", {}), text("never")]) as gw:
        with trio.fail_after(20):
            outcome = await run(
                tmp_path, host_for(gw, peer), manifest(["explode"]), args=["--runtime-module", module]
            )
    assert outcome.code == 1
    assert outcome.doc["status"] == "failed"
    assert "the warehouse is on fire" in outcome.doc["error"]["message"]
    assert len(gw.requests) == 1


async def test_max_tool_calls_per_iteration(tmp_path):
    script = [
        tool_calls(("docs__search", {"q": "1"}), ("docs__search", {"q": "2"}), ("docs__search", {"q": "3"})),
        text("done"),
    ]
    async with mcp_peer() as peer, scripted_gateway(script) as gw:
        with trio.fail_after(20):
            outcome = await run(
                tmp_path,
                host_for(gw, peer),
                manifest(["docs__search"], limits={"maxToolCallsPerIteration": 2}),
            )
    assert outcome.code == 0, outcome.raw
    assert [c["arguments"]["q"] for c in peer.calls] == ["1", "2"]
    seen = observations(gw.requests[1])
    assert "maxToolCallsPerIteration (2) reached" in seen[2]
    assert [e["outcome"] for e in outcome.named("model.tool.completed")] == ["ok", "ok", "limited"]
    assert len(outcome.named("model.tool.requested")) == 3 and len(outcome.named("model.tool.started")) == 2


async def test_tool_timeout_cancels_with_notification(tmp_path, autojump_clock):
    script = [tool_call("docs__slow", {"seconds": 120}), text("gave up")]
    async with mcp_peer() as peer, scripted_gateway(script) as gw:
        with trio.fail_after(300):
            outcome = await run(tmp_path, host_for(gw, peer, toolTimeoutMs=500), manifest(["docs__slow"]))
        with trio.fail_after(5):
            while not peer.cancelled:
                await trio.sleep(0.01)
    assert outcome.code == 0, outcome.raw
    assert "no answer within 0.5 s" in observations(gw.requests[1])[0]
    assert peer.cancelled[0]["requestId"] is not None
    assert outcome.named("model.tool.completed")[0]["outcome"] == "fault"


async def test_connect_timeout(tmp_path, autojump_clock):
    async with mcp_peer(never_answer=True) as peer, scripted_gateway([text("x")]) as gw:
        with trio.fail_after(300):
            outcome = await run(
                tmp_path, host_for(gw, peer, connectTimeoutMs=2000), manifest(["docs__search"])
            )
    assert outcome.code == 6
    assert "within 2 s" in outcome.doc["error"]["message"]


async def test_steps_run_in_order_and_see_earlier_outputs(tmp_path):
    steps = [
        {"id": "find", "prompt": "Find the doc.", "tools": ["docs__search"]},
        {"id": "summarize", "prompt": "Summarize what you found.", "tools": []},
    ]
    script = [tool_call("docs__search", {"q": "x"}), text("doc 7 says hello"), text("Summary: hello")]
    async with mcp_peer() as peer, scripted_gateway(script) as gw:
        with trio.fail_after(20):
            outcome = await run(
                tmp_path,
                host_for(gw, peer),
                {"connections": [{"ref": "docs", "alias": "docs"}], "steps": steps},
            )
    assert outcome.code == 0, outcome.raw
    assert outcome.doc["outputs"] == {"find": "doc 7 says hello", "summarize": "Summary: hello"}
    assert outcome.doc["result"] == "Summary: hello" and outcome.doc["steps"] == 3
    last = gw.requests[2]
    assert last.tool_names == []  # the second step offers no tools at all
    texts = [m["content"] for m in last.messages]
    assert any("doc 7 says hello" in (t or "") for t in texts)
    assert texts[-1] == "Summarize what you found."


async def test_authorize_connection_denies_a_required_binding(tmp_path):
    module = str(
        write(
            tmp_path,
            "runtime.py",
            """
def authorize_connection(request):
    return {"allowed": request.tenant == "acme", "reason": "tenant mismatch"}
""",
        )
    )
    async with mcp_peer() as peer, scripted_gateway([text("x")]) as gw:
        with trio.fail_after(20):
            outcome = await run(
                tmp_path,
                host_for(gw, peer),
                manifest(["docs__search"]),
                args=["--runtime-module", module, "--tenant", "other"],
            )
    assert outcome.code == 6 and outcome.doc["error"]["code"] == "connection_denied"
    assert peer.headers_seen == [] and gw.requests == []
