"""scripts/demo end to end (server-everything + the offline model), and the trace printer it uses (agentd trace)."""

from __future__ import annotations

import io
import json
import os
import subprocess

import pytest
import trio

from agentd.terminal.trace import trace
from tests.peers import launch

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]


async def test_demo_runs_end_to_end() -> None:
    if not (launch.everything_server_dir() / "dist" / "index.js").exists():
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail("server-everything not installed")
        pytest.skip("server-everything not installed (run scripts/test)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    with trio.fail_after(120):
        done = await trio.run_process([str(launch.REPO_ROOT / "scripts" / "demo"), "--max-steps", "3"],
                                      capture_stdout=True, capture_stderr=True, check=False, env=env,
                                      stdin=subprocess.DEVNULL)
    assert done.returncode == 7, done.stderr.decode()[-2000:]
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["steps"], doc["partial"]) == ("exhausted_steps", 3, True)
    trace_text = done.stderr.decode()
    assert "offline test model" in trace_text
    assert "→ echo on everything" in trace_text and "✗ exhausted_steps after 3 steps" in trace_text
    assert "(exit 7)" in trace_text
    # progress with timings, and a summary that explains the counts and each isError result
    assert "server up in " in trace_text and "the run took " in trace_text and "total " in trace_text
    assert "the MCP server 'everything' offers " in trace_text and "built-in control tools" in trace_text
    assert "- 3 tool calls, none returned isError" in trace_text


async def test_demo_explains_every_is_error_result() -> None:
    """The whole demo (every tool once): each isError result gets its plain reason in the summary."""
    if not (launch.everything_server_dir() / "dist" / "index.js").exists():
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail("server-everything not installed")
        pytest.skip("server-everything not installed (run scripts/test)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    with trio.fail_after(180):
        done = await trio.run_process([str(launch.REPO_ROOT / "scripts" / "demo")], capture_stdout=True,
                                      capture_stderr=True, check=False, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    observed = json.loads(done.stdout)["result"]["observed"]
    failing = [name.split("__", 1)[1] for name, r in observed.items() if r["isError"]]
    summary = done.stderr.decode().split("what the trace shows", 1)[1]
    assert "returned isError" in summary and len(failing) >= 1
    for name in failing:
        [line] = [x for x in summary.splitlines() if x.startswith(f"  - {name}")]
        assert "the server reported an error (see its text)" not in line, line  # each has its known reason


def test_trace_renders_every_story_event_and_passes_other_text() -> None:
    base = {"ts": "2026-11-29T12:00:00.123Z", "level": "info", "run_id": "r", "agent_path": "0", "comp": "agent",
            "pid": 1}
    events = [
        {"event": "run.start", "model": "m", "intelligence": ["test"], "servers": ["s"]},
        {"event": "loop.start", "tools": 3, "resources": 1, "max_steps": 5, "max_tokens": 9, "deadline": 1.0},
        {"event": "loop.step", "step": 1, "tool_calls": 1, "content": 0, "usage": {"total_tokens": 5}},
        {"event": "tool.call", "server": "s", "tool": "t", "arguments": 2},
        {"event": "tool.rejected", "reason": "bad"},
        {"event": "tool.result", "tool": "t", "kind": "fault", "size": 3, "ms": 1.5},
        {"event": "loop.budget", "budget": "deadline"},
        {"event": "loop.final", "status": "deadline", "steps": 1, "result": 0, "partial": True},
        {"event": "run.end", "status": "deadline", "exit_code": 7, "usage": {"total_tokens": 5}, "error": "x"},
        {"event": "mcp.ping_missed", "server": "s"},
    ]
    lines = [json.dumps({**base, **e}) for e in events] + ["not json at all"]
    out = io.StringIO()
    trace(lines, out)
    text = out.getvalue()
    # loop.final (run.end tells it) and mcp.ping_missed (info) hidden, the stray line shown
    assert text.count("\n") == len(events) - 1
    assert "← t: failed, 3 chars" in text and "rejected: bad" in text and "not json at all" in text
    assert "12:00:00.123 | step 1 · 1 tool call · 5 tokens" in text
    everything = io.StringIO()
    trace(lines, everything, everything=True)
    assert "mcp.ping_missed" in everything.getvalue()
