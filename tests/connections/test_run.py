"""``agentd run`` end to end against the in-process MCP peer and the scripted gateway."""

from __future__ import annotations

import trio

from tests.connections.helpers import connection, run
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call

SECRET_ARG = "needle-argument-value-42"


async def test_prefixing_narrowing_and_events(tmp_path):
    async with mcp_peer() as peer, scripted_gateway(
        [tool_call("d__search", {"q": SECRET_ARG}), text("found it")]
    ) as gw:
        host = {
            "version": "1.0",
            "intelligence": {"url": gw.url, "model": "m"},
            "connections": {"docs": connection(f"{peer.origin}/mcp", mode="read_write",
                                               tools=["search", "read", "delete"], readTools=["search", "read"])},
            "transcript": {"enabled": False},
        }
        manifest = {
            "connections": [{"ref": "docs", "alias": "d", "mode": "read", "tools": ["search"]}],
            "steps": [{"id": "answer", "type": "prompt", "prompt": "Find it.", "tools": ["d__search"]}],
        }
        with trio.fail_after(20):
            outcome = await run(tmp_path, host, manifest)
    assert outcome.code == 0, outcome.raw
    assert outcome.doc["status"] == "completed"
    assert outcome.doc["outputs"] == {"answer": "found it"}
    # Only the allowed tool reached the model, prefixed with the alias.
    assert [r.tool_names for r in gw.requests] == [["d__search"], ["d__search"]]
    assert peer.calls == [{"name": "search", "arguments": {"q": SECRET_ARG}}]
    # Server annotations are shown as information only.
    offered = gw.requests[0].body["tools"][0]["function"]["description"]
    assert "readOnlyHint=true" in offered and "informational only" in offered
    names = [e["event"] for e in outcome.events if e["event"].startswith("model.tool.")]
    assert names == ["model.tool.requested", "model.tool.started", "model.tool.completed"]
    completed = outcome.named("model.tool.completed")[0]
    assert completed["outcome"] == "ok" and completed["name"] == "d__search" and completed["call_id"]
    for event in outcome.events:
        if event["event"].startswith("model.tool."):
            assert "arguments" not in event and "result" not in event
    assert SECRET_ARG not in outcome.raw.split("\n")[-2]  # not in the result line
    assert all(SECRET_ARG not in str(e) for e in outcome.events)
