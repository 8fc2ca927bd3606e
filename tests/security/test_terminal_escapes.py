"""Text from servers and peers reaches a person's terminal shown, never obeyed: the live view, ``agentd check``'s
table, ``agentd trace`` and error lines escape C0 (but newline and tab), DEL and C1 controls visibly (``\\x1b``),
agentd's own colours stay; JSON output escapes C1 as ``\\u009b`` (``json.dumps(ensure_ascii=False)`` leaves it
raw, and U+009B is a CSI to a terminal).

Before: an OSC title from a server's error message lost its BEL but kept its ESC (and so still reached the
terminal), and ``agentd check --json`` printed U+009B raw. Each check here runs the real CLI on a pseudo-terminal
against a real (fake, local) MCP server whose every answer is laced with control sequences.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.formats.jsontext import escape_controls
from agentd.terminal.story import describe, error_text
from agentd.terminal.visible import visible, visible_line
from tests.client.fakeserver import Req, Resp, error, mcp_answer, serve_fake
from tests.terminal.pty_run import PtyRun

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

#: An OSC window title, a screen clear, a C1 CSI (U+009B) colour, a bell and a DEL.
HOSTILE = "boom \x1b]0;pwned\x07 \x1b[2J \x9b31m red \x07 \x7f end"
#: What must never reach the terminal raw.
RAW = [b"\x1b]0;pwned", b"\x1b[2J", "\x9b".encode(), b"\x07", b"\x7f"]


def test_visible_escapes_every_control_but_newline_and_tab_and_keeps_the_text() -> None:
    assert visible(HOSTILE) == "boom \\x1b]0;pwned\\x07 \\x1b[2J \\x9b31m red \\x07 \\x7f end"
    assert visible("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert visible_line("two\nlines\r") == "two\\nlines\\x0d"
    assert visible("ünïcödé ✓") == "ünïcödé ✓"


def test_bidirectional_controls_are_shown_not_obeyed() -> None:
    # "Trojan Source": an override drawn raw reorders the rest of the line ("fs__read\u202e" ... reads reversed).
    tricky = "fs__delete\u202e\u2066daer__sf\u2069\u202c \u200f\u061c"
    assert visible(tricky) == "fs__delete\\u202e\\u2066daer__sf\\u2069\\u202c \\u200f\\u061c"
    assert visible("שלום عربي") == "שלום عربي"  # right-to-left text itself stays as it is


def test_json_output_escapes_c1_and_del_and_stays_the_same_json() -> None:
    text = escape_controls(json.dumps({"error": HOSTILE}, ensure_ascii=False))
    assert "\x9b" not in text and "\x7f" not in text and "\\u009b" in text
    assert json.loads(text) == {"error": HOSTILE}


def test_story_lines_and_error_lines_are_visible() -> None:
    line = describe({"event": "mcp.connect_failed", "level": "error", "server": "s", "error": HOSTILE,
                     "ts": "2026-01-01T00:00:00.000\x1b[2J"})
    assert line is not None and all(raw.decode() not in line.text + line.ts for raw in RAW)
    assert "\\x1b]0;pwned" in line.text
    assert "\x1b" not in error_text(HOSTILE) and "\n" not in error_text("a\nb")


async def _hostile(req: Req, resp: Resp) -> None:
    if req.rpc_method == "initialize":
        await resp.json(error(req, -32603, HOSTILE))
    else:
        await mcp_answer(req, resp)


def _assert_shown_not_obeyed(raw: bytes) -> None:
    for sequence in RAW:
        assert sequence not in raw, (sequence, raw[-2000:])
    assert b"\\x1b]0;pwned" in raw  # the text is still there to read


async def _in_pty(args: list[str], **options: Any) -> tuple[int, bytes, str]:
    run = PtyRun(args, **options)
    code, _, stdout = await trio.to_thread.run_sync(run.finish)
    return code, run.raw, stdout


async def test_check_at_a_terminal_shows_a_servers_error_with_agentds_colours_and_json_escapes_c1() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_fake, _hostile)
        code, raw, _ = await _in_pty(["check", "--mcp", f"evil={server.url}"], stdout_tty=True)
        assert code == 6, raw[-2000:]
        _assert_shown_not_obeyed(raw)
        assert b"\x1b[1;31m" in raw or b"\x1b[31;1m" in raw  # agentd's own bold red is kept
        # --output json (stdout a pipe, stderr the terminal's live view)
        code, raw, stdout = await _in_pty(["check", "--mcp", f"evil={server.url}", "--output", "json"])
        assert code == 6
        _assert_shown_not_obeyed(raw)
        assert "\x9b" not in stdout and "\\u009b" in stdout
        assert HOSTILE in json.loads(stdout)["servers"][0]["error"]  # the same value, escaped
        nursery.cancel_scope.cancel()


async def test_a_run_at_a_terminal_and_trace_of_its_log_show_a_servers_error_visibly(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_fake, _hostile)
        args = ["--mcp", f"evil={server.url}", "--intelligence", "test", "--instruction", "hi"]
        code, raw, _ = await _in_pty([*args, "--output", "human"], stdout_tty=True)  # the live view, the result
        assert code == 6, raw[-2000:]
        _assert_shown_not_obeyed(raw)
        assert b"mcp_failed" in raw
        # the same run logged as JSON lines (stderr a file), then told by ``agentd trace`` at a terminal
        log = tmp_path / "events.jsonl"
        with log.open("wb") as sink:
            done = await trio.run_process([sys.executable, "-m", "agentd", *args, "--log-format", "json"],
                                          stdout=sink, stderr=sink, check=False)
        assert done.returncode == 6
        assert "\x9b".encode() not in log.read_bytes()  # JSON lines escape C1 too
        code, raw, _ = await _in_pty(["trace", str(log)], stdout_tty=True)
        assert code == 0
        _assert_shown_not_obeyed(raw)
        nursery.cancel_scope.cancel()
