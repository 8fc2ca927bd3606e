"""``agentd run`` end to end against the in-process MCP peer and the scripted gateway."""

from __future__ import annotations

import trio

from tests.connections.helpers import connection, run
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call

SECRET_ARG = "needle-argument-value-42"


async def test_prefixing_narrowing_and_events(tmp_path):
    async with (
        mcp_peer() as peer,
        scripted_gateway([tool_call("d__search", {"q": SECRET_ARG}), text("found it")]) as gw,
    ):
        host = {
            "version": "1.0",
            "intelligence": {"url": gw.url, "model": "m"},
            "connections": {
                "docs": connection(
                    f"{peer.origin}/mcp",
                    mode="read_write",
                    tools=["search", "read", "delete"],
                    readTools=["search", "read"],
                )
            },
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


async def test_allowlisted_tool_the_server_lacks_is_warned_and_absent(tmp_path):
    async with mcp_peer() as peer, scripted_gateway([text("nothing to do")]) as gw:
        host = {
            "intelligence": {"url": gw.url},
            "connections": {"docs": connection(f"{peer.origin}/mcp", tools=["search", "ghost"],
                                               readTools=["search", "ghost"])},
            "transcript": {"enabled": False},
        }
        manifest = {"connections": [{"ref": "docs"}],
                    "steps": [{"id": "s", "prompt": "p", "tools": ["docs__search", "docs__ghost"]}]}
        with trio.fail_after(20):
            outcome = await run(tmp_path, host, manifest)
    assert outcome.code == 0, outcome.raw
    assert gw.requests[0].tool_names == ["docs__search"]
    warning = outcome.named("config.warning")[0]
    assert warning["connection"] == "docs" and warning["missing_tools"] == ["ghost"]


async def test_cli_subprocess_prints_one_result_line(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from tests.connections.helpers import files

    db = tmp_path / "store" / "t.sqlite3"
    async with mcp_peer() as peer, scripted_gateway([tool_call("docs__search", {"q": "1"}), text("fine")]) as gw:
        host = {"intelligence": {"url": gw.url},
                "connections": {"docs": connection(f"{peer.origin}/mcp", tools=["search"], readTools=["search"])},
                "transcript": {"path": str(db), "dataPolicy": "metadata_only"}}
        manifest = {"connections": [{"ref": "docs"}], "steps": [{"id": "s", "prompt": "p", "tools": ["docs__search"]}]}
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}
        argv = [sys.executable, "-m", "agentd", "run", *files(tmp_path, host, manifest), "--run-id", "sub-1"]
        with trio.fail_after(60):
            proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["status"] == "completed"
    events = [json.loads(x)["event"] for x in proc.stderr.decode().splitlines()]
    assert "model.tool.completed" in events and events[-1] == "run.end"
    listed = subprocess.run([sys.executable, "-m", "agentd", "transcript", "list", "--db", str(db)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == ["sub-1"]
