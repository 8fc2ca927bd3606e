"""Every bad configuration is exit 2, before any network traffic, with one stderr line naming the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import assert_untouched, run_agentd, tripwire

SECRET = "sk-live-Zx9Qw8Er7Ty6Ui5Op4As3Df2"


def cases(port: int, tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (extra argv, a fragment the error line must contain)."""
    (tmp / "unknown.yaml").write_text("mcp_servers: []\nbogus_key: 1\n")
    (tmp / "conflict.yaml").write_text(f"mcp_servers:\n  - {{name: probe, url: 'http://127.0.0.1:{port}/other'}}\n")
    (tmp / "inline.yaml").write_text(
        f"mcp_servers:\n  - name: other\n    url: http://127.0.0.1:{port}/mcp\n"
        f"    headers: {{Authorization: 'Bearer {SECRET}'}}\n")
    (tmp / "cert.pem").write_text("x")
    return {
        "empty-name": (["--mcp", f"=http://127.0.0.1:{port}/mcp"], "empty server name"),
        "duplicate-name": (["--mcp", f"probe=http://127.0.0.1:{port}/two"], "duplicate server name 'probe'"),
        "missing-equals": (["--mcp", f"probehttp://127.0.0.1:{port}"], f"'probehttp://127.0.0.1:{port}'"),
        "other-scheme": (["--mcp", "x=ftp://files.example/mcp"], "'ftp://files.example/mcp'"),
        "http-non-loopback": (["--mcp", "x=http://mcp.example/mcp"], "'mcp.example'"),
        "intelligence-http": (["--intelligence", "http://gw.example/v1"], "'gw.example'"),
        "reactive-no-subscribe": (["--mode", "reactive"], "--subscribe"),
        "schedule-no-timer": (["--mode", "schedule"], "--interval or --cron"),
        "bad-cron": (["--mode", "schedule", "--cron", "* * *"], "'* * *'"),
        "serve-no-auth": (["--serve-mcp", "https://0.0.0.0:8443", "--serve-cert", str(tmp / "cert.pem"),
                           "--serve-key", str(tmp / "cert.pem")], "https://0.0.0.0:8443"),
        "serve-plain-public": (["--serve-mcp", "http://0.0.0.0:8080"], "'0.0.0.0'"),
        "unknown-key": (["--config", str(tmp / "unknown.yaml")], "'bogus_key'"),
        "mcp-conflict": (["--config", str(tmp / "conflict.yaml")], "conflicts"),
        "inline-credential": (["--config", str(tmp / "inline.yaml")], "'Authorization'"),
        "literal-token": (["--intelligence-token", SECRET], "--intelligence-token"),
        "missing-secret": (["--intelligence-token", "{{secret:MISSING_GW_TOKEN}}"], "MISSING_GW_TOKEN"),
        "unknown-flag": (["--frobnicate"], "--frobnicate"),
        "bad-duration": (["--deadline", "soon"], "'soon'"),
        "bad-mode": (["--mode", "sometimes"], "'sometimes'"),
        "bad-number": (["--max-steps", "many"], "'many'"),
    }


NAMES = [
    "empty-name", "duplicate-name", "missing-equals", "other-scheme", "http-non-loopback", "intelligence-http",
    "reactive-no-subscribe", "schedule-no-timer", "bad-cron", "serve-no-auth", "serve-plain-public",
    "unknown-key", "mcp-conflict", "inline-credential", "literal-token", "missing-secret", "unknown-flag",
    "bad-duration", "bad-mode", "bad-number",
]


@pytest.mark.parametrize("name", NAMES)
def test_exit_2_before_any_traffic(name: str, tmp_path: Path) -> None:
    with tripwire() as sock:
        port = sock.getsockname()[1]
        extra, fragment = cases(port, tmp_path)[name]
        base = ["--instruction", "x", "--intelligence", f"http://127.0.0.1:{port}/v1",
                "--mcp", f"probe=http://127.0.0.1:{port}/mcp"]
        outcome = run_agentd([*base, *extra], env={"UNRELATED_SECRET": SECRET})
        assert outcome.code == 2, outcome
        assert outcome.stdout == ""
        lines = outcome.stderr.splitlines()
        assert len(lines) == 1, outcome.stderr
        (event,) = outcome.events
        assert event["event"] == "config.invalid" and event["exit_code"] == 2 and event["level"] == "error"
        assert fragment in event["error"], event["error"]
        assert SECRET not in outcome.stderr
        assert_untouched(sock)


def test_no_arguments_and_no_environment_is_usage() -> None:
    outcome = run_agentd([])
    assert outcome.code == 2 and outcome.stdout == ""
    # a person typed bare ``agentd``: the short usage, then what is missing (tests/terminal has the rest)
    assert outcome.stderr.startswith("usage: agentd") and "agentd: --instruction" in outcome.stderr


def test_environment_errors_name_the_variable() -> None:
    outcome = run_agentd(["--instruction", "x", "--intelligence", "test"], env={"AGENTD_MAX_STEPS": "lots"})
    assert outcome.code == 2
    assert outcome.events[0]["error"] == "$AGENTD_MAX_STEPS: expected a whole number, got 'lots'"


def test_missing_instruction_before_any_traffic() -> None:
    with tripwire() as sock:
        port = sock.getsockname()[1]
        outcome = run_agentd(["--intelligence", f"http://127.0.0.1:{port}/v1", "--mcp",
                              f"probe=http://127.0.0.1:{port}/mcp"])
        assert outcome.code == 2 and outcome.stdout == ""
        (event,) = outcome.events
        assert "--instruction" in event["error"] and "--serve-mcp" in event["error"]
        assert_untouched(sock)


def test_serving_makes_the_instruction_optional() -> None:
    outcome = run_agentd(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0/mcp", "--validate-config"])
    assert outcome.code == 0 and outcome.document["config"]["instruction"] is None
