"""``agentd run`` and ``agentd transcript`` parse through the flag table, as ``agentd`` does.

Durations (``25s``), ``AGENTD_*`` environment variables, the error style (one JSON line on stderr, nothing on
stdout, exit 2) and the ``unknown flag`` wording are the same for every command. Each case goes through the
real CLI in a subprocess; every run here stops at binding (a manifest that asks for a tool the host does not
allow), so no gateway or MCP server is needed and the exit-2 error proves the flags were accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.connections.helpers import connection, write

URL = "http://127.0.0.1:9/mcp"


def _files(tmp_path: Path, *, intelligence: bool = True) -> list[str]:
    host: dict[str, object] = {"connections": {"docs": connection(URL, tools=["search"], readTools=["search"])},
                               "transcript": {"enabled": False}}
    if intelligence:
        host["intelligence"] = {"url": "http://127.0.0.1:9/v1"}
    manifest = {"connections": [{"ref": "docs", "tools": ["delete"]}],
                "steps": [{"id": "s", "prompt": "p", "tools": ["docs__search"]}]}
    return [str(write(tmp_path, "agent.yaml", manifest)), "--config", str(write(tmp_path, "host.yaml", host))]


def _agentd(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, list[dict[str, object]]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}
    proc = subprocess.run([sys.executable, "-m", "agentd", *args], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})})
    lines = [json.loads(line) for line in proc.stderr.splitlines()]  # every stderr line is a JSON event
    return proc.returncode, proc.stdout, lines


def _error(lines: list[dict[str, object]]) -> str:
    errors = [str(line["error"]) for line in lines if line.get("event") == "config.invalid"]
    assert len(errors) == 1, lines
    return errors[0]


BOUND = "$.connections[0].tools[0]"  # the binding error: every flag before it was accepted


def test_run_takes_durations_like_agentd(tmp_path: Path) -> None:
    code, out, lines = _agentd("run", *_files(tmp_path), "--drain-timeout", "25s", "--log-level", "warn")
    assert code == 2 and out == ""
    assert BOUND in _error(lines)


def test_run_reads_agentd_environment_variables(tmp_path: Path) -> None:
    # the host names no gateway: AGENTD_INTELLIGENCE supplies it, as it does for agentd
    code, out, lines = _agentd("run", *_files(tmp_path, intelligence=False),
                               env={"AGENTD_INTELLIGENCE": "http://127.0.0.1:9/v1"})
    assert code == 2 and out == ""
    assert BOUND in _error(lines)
    code, out, lines = _agentd("run", *_files(tmp_path), env={"AGENTD_DRAIN_TIMEOUT": "soon"})
    assert code == 2 and out == ""
    assert _error(lines).startswith("$AGENTD_DRAIN_TIMEOUT: not a duration")


def test_run_flag_errors_have_agentd_error_style(tmp_path: Path) -> None:
    code, out, lines = _agentd("run", *_files(tmp_path), "--drain-timeout", "soon")
    assert code == 2 and out == ""
    assert _error(lines).startswith("--drain-timeout: not a duration")
    code, out, lines = _agentd("run", *_files(tmp_path), "--intelligence-tokn", "sk-secret-value")
    assert code == 2 and out == ""
    error = _error(lines)
    assert "unknown flag --intelligence-tokn" in error and "agentd run --help" in error
    assert "sk-secret-value" not in error
    code, out, lines = _agentd("run", "--config", "host.yaml")
    assert code == 2 and out == "" and "MANIFEST" in _error(lines)
    code, out, lines = _agentd("run", *_files(tmp_path), "--mcp", "nameonly")
    assert code == 2 and out == "" and _error(lines).startswith("--mcp: missing '='")


def test_transcript_parses_through_the_flag_table(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite3"
    code, out, lines = _agentd("transcript", "list", "--db", str(db))
    assert code == 0 and json.loads(out) == {"runs": []}
    code, out, lines = _agentd("transcript", "list", "--db", str(db), "--bogus")
    assert code == 2 and out == ""
    assert "unknown flag --bogus" in _error(lines) and "agentd transcript --help" in _error(lines)
    code, out, lines = _agentd("transcript", "frob")
    assert code == 2 and out == "" and "invalid choice" in _error(lines)
    code, out, lines = _agentd("transcript", "show", "--db", str(db))
    assert code == 2 and out == "" and "RUN_ID is required" in _error(lines)


def test_a_remote_http_gateway_in_the_host_file_is_blamed_on_the_file(tmp_path: Path) -> None:
    files = _files(tmp_path)
    host = Path(files[-1])
    host.write_text(host.read_text().replace("http://127.0.0.1:9/v1", "http://gw.example/v1"))
    code, out, lines = _agentd("run", *files)
    assert code == 2 and out == ""
    error = _error(lines)
    assert error.startswith(f"--config {host} $.intelligence.url: plain http:// to non-loopback host 'gw.example'")
    assert "--intelligence" not in error
