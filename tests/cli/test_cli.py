"""The CLI surface: --validate-config, --help/--version, subcommands, the subagent dispatch, the run output,
signals turned into a drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.helpers import assert_untouched, clean_env, run_agentd, tripwire
from tests.peers import launch

HEAVY = ("httpx", "hypercorn", "jsonschema")


def imported(stderr: str) -> set[str]:
    """Top-level module names from ``-X importtime`` output."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_validate_config_ok_prints_effective_config_without_network(tmp_path: Path) -> None:
    config = tmp_path / "agentd.yaml"
    with tripwire() as sock:
        port = sock.getsockname()[1]
        config.write_text(f"mcp_servers:\n  - name: fs\n    url: http://127.0.0.1:{port}/mcp\n"
                          f"    headers: {{Authorization: 'Bearer {{{{secret:FS_TOKEN}}}}'}}\nmax_steps: 9\n")
        outcome = run_agentd(["--instruction", "x", "--intelligence", f"http://127.0.0.1:{port}/v1",
                              "--config", str(config), "--validate-config"],
                             env={"FS_TOKEN": "tok-abcdef-123456"})
        assert outcome.code == 0, outcome
        doc = outcome.document
        assert doc["valid"] is True
        assert doc["config"]["max_steps"] == 9
        assert doc["config"]["mcp"][0]["headers"] == {"Authorization": "Bearer {{secret:FS_TOKEN}}"}
        assert "tok-abcdef-123456" not in outcome.stdout + outcome.stderr
        assert_untouched(sock)


def test_validate_config_bad_is_2() -> None:
    outcome = run_agentd(["--instruction", "x", "--intelligence", "test", "--max-steps", "0", "--validate-config"])
    assert outcome.code == 2 and outcome.stdout == ""
    assert "--max-steps" in outcome.events[0]["error"]


def test_help_and_version_stay_light() -> None:
    outcome = run_agentd(["--help"], python_flags=["-X", "importtime"])
    assert outcome.code == 0
    for flag in ("--mcp NAME=URL", "--serve-bearer", "--budget-tokens-lifetime", "--continue", "--drain-timeout",
                 "exit codes"):
        assert flag in outcome.stdout
    assert not imported(outcome.stderr) & {*HEAVY, "trio", "cattrs", "yaml"}
    outcome = run_agentd(["--version"])
    assert outcome.code == 0 and outcome.stdout.startswith("agentd ")


def test_subagent_marker_dispatches_before_parsing() -> None:
    """With AGENT_SUBAGENT=1 the argv is never parsed (a bogus flag is not an error) and no config is loaded."""
    outcome = run_agentd(["--this-is-not-a-flag"], env={"AGENT_SUBAGENT": "1"}, python_flags=["-X", "importtime"],
                         timeout=30)
    modules = outcome.stderr
    assert "agentd.config.argv" not in modules and "agentd.config.load" not in modules
    assert "config.invalid" not in modules
    assert not imported(modules) & {"hypercorn"}


def test_run_prints_exactly_one_result_document() -> None:
    outcome = run_agentd(["--instruction", "say hi", "--intelligence", "test", "--run-id", "cli-run-1",
                          "--deadline", "30s"], timeout=60)
    doc = outcome.document
    assert set(doc) == {"run_id", "status", "done", "partial", "result", "steps", "usage"}
    assert doc["run_id"] == "cli-run-1"
    expected = {"completed": 3 if doc["partial"] else 0, "crashed": 1, "failed": 1, "cancelled": 1,
                "exhausted_steps": 7, "exhausted_tokens": 7, "deadline": 7, "intelligence_failed": 4,
                "mcp_failed": 6, "refused": 5}[doc["status"]]
    assert outcome.code == expected
    for event in outcome.events:
        assert {"ts", "level", "event", "run_id", "agent_path", "comp", "pid"} <= set(event)


def test_environment_alone_configures_a_run() -> None:
    """A container with no arguments: everything from AGENTD_*/AGENT_* (12-factor)."""
    outcome = run_agentd([], env={"AGENTD_INSTRUCTION": "say hi", "AGENT_INTELLIGENCE": "test",
                                  "AGENTD_RUN_ID": "from-env", "AGENTD_LOG_LEVEL": "warn"}, timeout=60)
    assert outcome.document["run_id"] == "from-env"
    assert all(event["level"] in ("warn", "error") for event in outcome.events)


def test_required_server_down_is_6() -> None:
    with tripwire() as sock:
        port = sock.getsockname()[1]
    outcome = run_agentd(["--instruction", "x", "--intelligence", "test", "--mcp", f"gone=http://127.0.0.1:{port}/mcp"],
                         timeout=60)
    assert outcome.code == 6 and outcome.document["status"] == "mcp_failed"


def test_run_with_a_missing_manifest_is_a_usage_error() -> None:
    outcome = run_agentd(["run", "no-such-agent.yaml"])
    assert outcome.code == 2 and "no-such-agent.yaml" in outcome.events[0]["error"]
    assert outcome.stdout.strip() == ""


def test_check_needs_a_server() -> None:
    outcome = run_agentd(["check"])
    assert outcome.code == 2 and "give something to check" in outcome.events[0]["error"]
    outcome = run_agentd(["check", "--mcp", "x=http://mcp.example/mcp"])
    assert outcome.code == 2 and "mcp.example" in outcome.events[0]["error"]


# --- signals -> drain -----------------------------------------------------------------------------------


def start_harness(behaviour: str, drain_timeout: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cli.drain_harness", behaviour, drain_timeout],
        cwd=Path(__file__).resolve().parents[2], env=clean_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[dict[str, object], list[dict[str, object]]]:
    stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    return json.loads(stdout), [json.loads(line) for line in stderr.splitlines()]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_requests_a_drain(signum: int) -> None:
    proc = start_harness("honour", "20s")
    os.kill(proc.pid, signum)
    doc, events = finish(proc)
    name = signal.Signals(signum).name
    assert doc == {"result": f"drained:{name}", "forced": False, "drained": True}
    assert [(e["event"], e["signal"], e["action"]) for e in events] == [("proc.signal", name, "drain")]


def test_drain_timeout_cancels_what_is_left() -> None:
    proc = start_harness("ignore", "200ms")
    os.kill(proc.pid, signal.SIGTERM)
    doc, events = finish(proc)
    assert doc == {"result": None, "forced": False, "drained": True}
    assert [e["event"] for e in events] == ["proc.signal", "drain.end"]


def test_second_signal_forces() -> None:
    proc = start_harness("ignore", "60s")
    os.kill(proc.pid, signal.SIGTERM)
    # Wait for the first signal to be seen before sending the second (its event line is on stderr).
    assert proc.stderr is not None
    first = json.loads(proc.stderr.readline())
    assert first["action"] == "drain"
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=20)
    assert json.loads(stdout) == {"result": None, "forced": True, "drained": True}
    assert json.loads(stderr.splitlines()[0])["action"] == "force"


def test_sigterm_during_a_real_run_is_a_clean_drain() -> None:
    """The real daemon, stuck on a gateway that never answers: SIGTERM ends it at --drain-timeout, exit 0."""
    import socket

    with socket.socket() as gateway:
        gateway.bind(("127.0.0.1", 0))
        gateway.listen(8)  # accepts (in the backlog) and never answers
        port = gateway.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", "--instruction", "x", "--intelligence", f"http://127.0.0.1:{port}/v1",
             "--drain-timeout", "300ms", "--run-id", "drained-run"],
            env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until the run has started (its first event after config.loaded)
            if json.loads(line)["event"] != "config.loaded":
                break
        os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    doc = json.loads(stdout)
    assert doc["run_id"] == "drained-run" and doc["done"] is True  # ended, as in every other end state
    assert '"proc.signal"' in stderr


@pytest.mark.interop
def test_budget_exit_code_remaps_7(sdk_server: launch.PeerProcess) -> None:
    """With a server offering tools, the offline model needs more than one step: the step budget runs out."""
    args = ["--instruction", "x", "--intelligence", "test", "--mcp", f"peer={sdk_server.url}", "--max-steps", "1"]
    plain = run_agentd(args, timeout=60)
    assert plain.document["status"] == "exhausted_steps" and plain.code == 7
    remapped = run_agentd([*args, "--budget-exit-code", "42"], timeout=60)
    assert remapped.document["status"] == "exhausted_steps" and remapped.code == 42
    assert "--budget-exit-code" in run_agentd(["--instruction", "x", "--intelligence", "test",
                                               "--budget-exit-code", "300"]).events[0]["error"]


def test_instruction_from_stdin() -> None:
    proc = subprocess.run([sys.executable, "-m", "agentd", "--instruction-file", "-", "--intelligence", "test",
                           "--validate-config"], input="summarise the inbox\n", capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["instruction"] == "summarise the inbox\n"


@pytest.mark.interop
def test_sigterm_drains_a_reactive_daemon_through_the_cli_latch(sdk_server: launch.PeerProcess) -> None:
    """The CLI owns the signals; the reactive daemon sees the same latch, drains, and the process exits 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentd", "--instruction", "triage", "--intelligence", "test",
         "--mcp", f"peer={sdk_server.url}", "--mode", "reactive", "--subscribe", "test://counter",
         "--drain-timeout", "5s"],
        env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(json.loads(line)["event"])
        if seen[-1] == "trigger.armed":
            break
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    events = [json.loads(line) for line in stderr.splitlines()]
    names = [e["event"] for e in events]
    assert names.count("proc.signal") == 1  # one owner of the signals: the CLI
    assert "drain.start" in names and names[-1] == "proc.exit"
    assert json.loads(stdout)["status"] == "completed"
