"""The story's unwrapping of forwarded child lines: a grandchild's events travel inside two ``subagent.stderr``
lines and still land at their own depth; a child's non-JSON stderr (a traceback) is shown, not lost."""

from __future__ import annotations

import json

from agentd.terminal.story import describe, expand, indent


def _forwarded(inner: dict, path: str) -> dict:
    return {"event": "subagent.stderr", "level": "info", "agent_path": path, "handle": path, "line": json.dumps(inner)}


def test_a_grandchild_step_lands_two_levels_deep() -> None:
    step = {"event": "loop.step", "agent_path": "0.1.1", "step": 2, "tool_calls": 0, "usage": {"total_tokens": 7}}
    wrapped = _forwarded(_forwarded(step, "0.1.1"), "0.1")
    (inner,) = list(expand(wrapped))
    line = describe(inner)
    assert line is not None and line.depth == 2 and indent(line) == "│  │  "
    assert line.text == "step 2 · 0 tool calls · 7 tokens"


def test_a_child_traceback_is_shown_at_the_child_depth() -> None:
    (inner,) = list(expand({"event": "subagent.stderr", "agent_path": "0.3", "line": "Traceback (most recent"}))
    line = describe(inner)
    assert line is not None and line.depth == 1 and "Traceback" in line.text and line.tone == "dim"


def test_the_drain_line_names_the_timeout() -> None:
    first = describe({"event": "proc.signal", "signal": "SIGINT", "action": "drain"}, drain_timeout=25)
    second = describe({"event": "proc.signal", "signal": "SIGINT", "action": "force"}, drain_timeout=25)
    term = describe({"event": "proc.signal", "signal": "SIGTERM", "action": "drain"}, drain_timeout=1.5)
    assert first is not None and first.text == "Ctrl-C: draining, up to 25 s; press Ctrl-C again to stop now"
    assert second is not None and second.text == "Ctrl-C again: stopping now"
    assert term is not None and term.text.startswith("SIGTERM: draining, up to 1.5 s")
