"""The command line for people, through real processes: ``agentd trace``, the ``agentd check`` table, help per
subcommand, "did you mean", bare ``agentd``, and ``--output human`` (also when the run crashes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.cli.helpers import clean_env, run_agentd
from tests.terminal.pty_run import run_in_pty


def _events_file(tmp_path: Path, copies: int = 1) -> Path:
    """A real run's stderr (JSON lines), repeated ``copies`` times."""
    outcome = run_agentd(["--instruction", "hi", "--intelligence", "test", "--log-level", "debug"])
    assert outcome.code == 0
    path = tmp_path / "events.jsonl"
    path.write_text(outcome.stderr * copies)
    return path


def test_trace_tells_a_saved_log(tmp_path: Path) -> None:
    path = _events_file(tmp_path)
    done = subprocess.run([sys.executable, "-m", "agentd", "trace", str(path)], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert any("| run " in line and "model default via test" in line for line in lines)
    assert any("| step 1 · 0 tool calls" in line for line in lines)
    assert any("| ✓ completed after 1 step" in line for line in lines)
    assert "\x1b" not in done.stdout  # piped: plain text
    everything = subprocess.run([sys.executable, "-m", "agentd", "trace", "--all", str(path)], capture_output=True,
                                text=True, env=clean_env(), timeout=60)
    assert len(everything.stdout.splitlines()) > len(lines)  # intel.call, loop.final, proc.exit ...


def test_trace_into_head_ends_quietly(tmp_path: Path) -> None:
    path = _events_file(tmp_path, copies=3000)  # far more than a pipe holds: head leaves while trace writes
    done = subprocess.run(f"'{sys.executable}' -m agentd trace '{path}' | head -1; echo \"trace exit ${{PIPESTATUS[0]}}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, env=clean_env(),
                          timeout=120)
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    out = done.stdout.splitlines()
    assert len(out) == 2 and "| run " in out[0] and out[1] == "trace exit 0"


def test_trace_of_a_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "agentd", "trace", str(tmp_path / "nope.jsonl")],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().startswith("agentd trace: cannot read") and "\n" not in done.stderr.strip()


def test_check_is_a_table_at_a_terminal_and_json_with_json_flag(sdk_server_factory) -> None:
    peer = sdk_server_factory()
    code, screen, _ = run_in_pty(["check", "--mcp", f"peer={peer.url}"], stdout_tty=True)
    assert code == 0, screen[-3000:]
    header = next(line for line in screen.splitlines() if "server" in line and "problems" in line)
    assert all(column in header for column in ("endpoint", "era", "tools", "resources"))
    assert "peer" in screen and "echo" in screen and "2025-11-25" in screen
    assert "built in (a run also offers): subagent.spawn" in screen and "resource.read" in screen
    assert '"servers"' not in screen
    code, screen, _ = run_in_pty(["check", "--mcp", f"peer={peer.url}", "--json"], stdout_tty=True)
    assert code == 0
    document = json.loads("".join(line for line in screen.splitlines() if not line.startswith("{\"ts\"")
                                  and not line.startswith(("│", "✓", "⏵")) and line.strip()))
    assert document["servers"][0]["name"] == "peer"


def test_check_table_names_the_problem_of_a_failed_server() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, screen, _ = run_in_pty(["check", "--mcp", f"gone=http://127.0.0.1:{port}/mcp", "--log-format", "json"],
                                 stdout_tty=True)
    assert code == 6
    assert "gone" in screen and "required; not connected" in screen and "a required server failed" in screen


def test_check_table_shows_the_gateway_and_its_hint_at_a_terminal(tmp_path: Path) -> None:
    from tests.peers.gateway import closed_port

    proxy = f"http://127.0.0.1:{closed_port()}"
    code, screen, _ = run_in_pty(["check", "--intelligence", "https://gw.example.test/v1", "--model", "m",
                                  "--log-format", "json"], stdout_tty=True, env={"HTTPS_PROXY": proxy})
    assert code == 4, screen[-3000:]
    assert "gateway (model m)" in screen and "reachable" in screen and "cannot reach the gateway" in screen
    assert "hint:" in screen and "NO_PROXY" in screen
    assert "the gateway check failed (exit 4)" in screen


def test_help_lists_only_the_flags_of_the_command() -> None:
    check = run_agentd(["check", "--help"])
    assert check.code == 0
    assert "--mcp" in check.stdout and "--json" in check.stdout and "--log-format" in check.stdout
    assert "--instruction" not in check.stdout and "--max-steps" not in check.stdout
    assert "--serve-mcp" not in check.stdout
    main = run_agentd(["--help"])
    assert "--instruction" in main.stdout and "--log-format" in main.stdout and "--output" in main.stdout
    options = main.stdout.split("\n\n", 1)[1]  # after the usage, which names the commands' own flags too
    assert "--json" not in options.replace("--json-", "") and "--db " not in options
    manifest = run_agentd(["run", "--help"])
    assert "--runtime-module" in manifest.stdout and "--instruction " not in manifest.stdout
    # check still accepts a run flag (one flag set serves both), it just does not list it
    accepted = run_agentd(["check", "--mcp", "a=http://127.0.0.1:1/mcp", "--max-steps", "3", "--validate-config"])
    assert accepted.code == 0, accepted.stderr


def test_a_mistyped_flag_gets_a_suggestion() -> None:
    outcome = run_agentd(["--instruction", "x", "--intelligence", "test", "--max-step", "3"])
    assert outcome.code == 2 and outcome.stdout == ""
    (event,) = outcome.events  # not at a terminal: still the one JSON error line
    assert "unknown flag --max-step (did you mean --max-steps?)" in event["error"]
    check = run_agentd(["check", "--mcpp", "a=http://127.0.0.1:1/mcp"])
    assert "--mcpp (did you mean --mcp?)" in check.events[0]["error"]
    nothing_close = run_agentd(["--instruction", "x", "--intelligence", "test", "--zzzzzz"])
    assert "did you mean" not in nothing_close.events[0]["error"]


def test_bare_agentd_prints_short_usage() -> None:
    outcome = run_agentd([])
    assert outcome.code == 2 and outcome.stdout == ""
    assert outcome.stderr.startswith("usage: agentd [run flags]")
    assert "agentd check" in outcome.stderr and "agentd trace FILE" in outcome.stderr
    assert "agentd: --instruction" in outcome.stderr  # what is missing, in one line
    assert not any(line.startswith("{") for line in outcome.stderr.splitlines())
    assert len(outcome.stderr.splitlines()) < 20
    # configured through the environment alone, bare agentd is a run as before
    configured = run_agentd([], env={"AGENTD_INSTRUCTION": "hi", "AGENTD_INTELLIGENCE": "test"})
    assert configured.code == 0 and configured.document["status"] == "completed"


def test_output_human_still_prints_a_crash() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        outcome = run_agentd(["--serve-mcp", f"http://127.0.0.1:{port}/mcp", "--instruction", "x",
                              "--intelligence", "test", "--output", "human"])
    assert outcome.code == 1
    assert outcome.stdout.startswith("crashed · 0 steps")
    assert "error: OSError" in outcome.stdout and "Address already in use" in outcome.stdout


def test_a_run_at_a_terminal_prints_its_result_for_a_person_and_json_when_asked() -> None:
    run = ["--instruction", "say hi", "--intelligence", "test", "--log-format", "json"]
    code, screen, _ = run_in_pty(run, stdout_tty=True)  # the pty has the JSON event lines of stderr too
    lines = [line.strip() for line in screen.splitlines()]
    assert code == 0 and any(line.startswith("completed · ") for line in lines), screen
    assert not any(line.startswith('{"run_id"') for line in lines), screen
    code, screen, _ = run_in_pty([*run, "--output", "json"], stdout_tty=True)
    [document] = [line for line in (line.strip() for line in screen.splitlines()) if line.startswith('{"run_id"')]
    assert code == 0 and json.loads(document)["status"] == "completed"
    piped = run_agentd(run)  # through a pipe: the one JSON document, as scripts expect
    assert piped.code == 0 and piped.document["status"] == "completed"
