"""The live view at a real terminal (a pty): the story of a run, the subagent tree, JSON on request, NO_COLOR,
Ctrl-C, and stdout still one JSON document."""

from __future__ import annotations

import json

import pytest

from tests.peers import launch
from tests.peers.gateway import gateway_argv
from tests.terminal.pty_run import PtyRun, run_in_pty


def _spawn_script(tmp_path, child_reply):
    script = {
        "rules": [
            {"match": {"contains": "CHILD TASK"}, "reply": child_reply},
            {"match": {"last_role": "tool"}, "reply": {"content": "root done"}},
        ],
        "default": {"tool_calls": [{"name": "subagent_spawn", "arguments": {"instruction": "CHILD TASK"}}]},
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return path


@pytest.fixture
def spawn_gateway(tmp_path):
    with launch.start_peer(gateway_argv(_spawn_script(tmp_path, {"content": "child says hi"}))) as gw:
        yield gw


def _root(url: str, *extra: str) -> list[str]:
    return ["--instruction", "ROOT TASK: delegate it", "--intelligence", url, *extra]


def test_a_run_with_a_subagent_is_drawn_as_a_tree(spawn_gateway, no_leftover_children) -> None:
    code, screen, stdout = run_in_pty(_root(spawn_gateway.url))
    assert code == 0, screen[-3000:]
    lines = [line.rstrip() for line in screen.splitlines()]
    # the root's steps, the tool it called, the child's own step indented under it, the child's end, the run's end
    assert any(line.startswith("step 1 · 1 tool call · 15 tokens") for line in lines), screen
    assert "→ subagent.spawn" in lines
    spawn = next(i for i, line in enumerate(lines) if line.startswith("├─ subagent 0.1 started"))
    child_step = next(i for i, line in enumerate(lines) if line.startswith("│  step 1 · 0 tool calls"))
    exit_line = next(i for i, line in enumerate(lines) if line.startswith("└─ subagent 0.1 completed"))
    assert spawn < child_step < exit_line
    # the whole tree's tokens: the root's 2 replies and the child's 1 (15 each)
    assert any(line.startswith("✓ completed after 2 steps · 45 tokens") for line in lines)
    assert '"event"' not in screen  # no JSON lines for a person
    doc = json.loads(stdout)  # stdout is still the one JSON document
    assert doc["status"] == "completed" and doc["result"] == "root done"


def test_tools_are_named_with_their_server(sdk_server_factory) -> None:
    peer = sdk_server_factory()
    code, screen, _ = run_in_pty(["--instruction", "try the tools", "--intelligence", "test",
                                  "--mcp", f"peer={peer.url}"])
    assert code == 0, screen[-3000:]
    assert "✓ peer connected" in screen
    assert "→ echo on peer" in screen and "← echo on peer: ok" in screen
    assert "← fail on peer: error" in screen  # a tool error is a clear line of its own


def test_log_format_json_at_a_terminal_is_todays_json_lines(spawn_gateway) -> None:
    code, screen, stdout = run_in_pty(_root(spawn_gateway.url, "--log-format", "json"))
    assert code == 0
    events = [json.loads(line) for line in screen.splitlines() if line.strip()]
    assert [e["event"] for e in events][:2] == ["config.loaded", "run.start"]
    assert {"ts", "level", "event", "run_id", "agent_path", "comp", "pid"} <= set(events[0])
    assert json.loads(stdout)["status"] == "completed"


def test_no_color_means_no_escape_codes(spawn_gateway) -> None:
    run = PtyRun(_root(spawn_gateway.url), env={"NO_COLOR": "1"})
    run.finish()
    assert "\x1b" not in run.text and "step 1" in run.text and "└─ subagent 0.1 completed" in run.text


def test_ctrl_c_says_it_drains_and_a_second_stops_at_once(tmp_path, no_leftover_children) -> None:
    slow_child = {"content": "too late", "delay": 60}
    with launch.start_peer(gateway_argv(_spawn_script(tmp_path, slow_child))) as gw:
        run = PtyRun(_root(gw.url))
        run.read_until("├─ subagent 0.1 started")
        run.interrupt()
        run.read_until("Ctrl-C: draining, up to 25 s; press Ctrl-C again to stop now")
        run.interrupt()
        code, screen, stdout = run.finish()
    assert "Ctrl-C again: stopping now" in screen
    assert code == 1
    assert json.loads(stdout)["status"] == "cancelled"


def test_a_bad_flag_at_a_terminal_is_one_readable_line() -> None:
    code, screen, stdout = run_in_pty(["--instruction", "x", "--intelligence", "test", "--max-step", "3"])
    assert code == 2 and stdout == ""
    assert "agentd: error: unknown flag --max-step (did you mean --max-steps?)" in screen
    assert "{" not in screen


def test_output_human_prints_the_result_for_a_person(spawn_gateway) -> None:
    code, screen, _ = run_in_pty(_root(spawn_gateway.url, "--output", "human"), stdout_tty=True)
    assert code == 0
    assert "completed · 2 steps · 45 tokens" in screen and "root done" in screen  # the whole tree's
    assert '"run_id"' not in screen


def test_the_reasoning_line_and_a_rejected_call_are_shown(tmp_path) -> None:
    script = {"rules": [{"match": {"last_role": "tool"}, "reply": {"content": "done"}}],
              "default": {"content": "Let me look this up first.\nThen answer.",
                          "tool_calls": [{"name": "no_such_tool", "arguments": {}}]}}
    (tmp_path / "script.json").write_text(json.dumps(script))
    with launch.start_peer(gateway_argv(tmp_path / "script.json")) as gw:
        code, screen, _ = run_in_pty(["--instruction", "go", "--intelligence", gw.url, "--log-content"])
        _, without, _ = run_in_pty(["--instruction", "go", "--intelligence", gw.url])
    assert code == 0, screen[-3000:]
    assert "step 1 · 1 tool call · 15 tokens · “Let me look this up first.”" in screen
    assert "→ no_such_tool" in screen and "← no_such_tool: rejected" in screen
    assert "Let me look" not in without  # text is shown only where --log-content lets events carry it
