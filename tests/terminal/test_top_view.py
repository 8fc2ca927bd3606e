"""``agentd top``'s screen (agentd.terminal.top.View), drawn with rich: the tree with its tools in flight and
elapsed time, the selection, collapsed nodes, and daemon text whose control characters cannot reach the
terminal. The live command itself is tested in a pty against a real daemon (tests/telemetry/test_events_stream.py,
tests/cli/test_top_tls.py)."""

from __future__ import annotations

from agentd.terminal.top import View


def _view() -> View:
    view = View(status="connected")
    view.take({"event": "tree.node", "run_id": "r1", "handle": "0", "parent": None, "status": "running", "steps": 2,
               "tokens": 40, "tools": ["fs__read"], "elapsed_s": 3.2})
    view.take({"event": "tree.node", "run_id": "r1", "handle": "0.1", "parent": "0", "status": "completed",
               "steps": 1, "tokens": 10, "tools": [], "elapsed_s": 1.0})
    return view


def test_the_screen_shows_the_tree_its_tools_and_elapsed_time() -> None:
    screen = _view().render(100)
    lines = screen.removeprefix("\x1b[H\x1b[2J").split("\r\n")
    assert lines[0].startswith("agentd top  [connected]")
    assert lines[1].split() == ["handle", "status", "steps", "tokens", "elapsed", "tools", "run"]
    assert lines[2].split() == [">", "0", "running", "2", "40", "3", "s", "fs__read", "r1"]
    assert lines[3].split() == ["0.1", "completed", "1", "10", "1", "s", "r1"]


def test_collapsing_hides_the_children_and_marks_the_node() -> None:
    view = _view()
    assert view.key(b" ") is True
    screen = view.render(100)
    assert "+0" in screen and "0.1" not in screen
    assert view.key(b"q") is False


def test_daemon_text_cannot_drive_the_terminal() -> None:
    view = _view()
    view.take({"event": "tree.node", "run_id": "r\x1b]0;owned\x07", "handle": "0", "parent": None,
               "status": "running\x1b[2J", "tools": ["evil\x1b[31m"], "steps": 1, "tokens": 1})
    view.take({"event": "tool.call", "tool": "x\x1b[H\x1b[2Jy", "server": "\u202eevil"})
    screen = view.render(120).removeprefix("\x1b[H\x1b[2J")
    assert "\x1b" not in screen and "\x07" not in screen and "\u202e" not in screen
    assert "\\x1b[2J" in screen and "\\x1b[31m" in screen


def test_color_is_drawn_only_when_asked() -> None:
    assert "\x1b[" not in _view().render(100).removeprefix("\x1b[H\x1b[2J")
    assert "\x1b[32m" in _view().render(100, color=True) or "\x1b[1;32m" in _view().render(100, color=True)
