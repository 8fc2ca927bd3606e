"""Whole-config validation: modes, scheduling, the self-MCP listener, numbers, TLS files."""

from pathlib import Path

import pytest

from agentd.config.load import load_config
from agentd.config.validate import split_subscription
from agentd.errors import ConfigError

BASE = ["--instruction", "do it", "--intelligence", "test"]


def refused(*argv: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(list(argv), env=env or {})
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    paths = {}
    for name in ("cert", "key", "ca"):
        (tmp_path / f"{name}.pem").write_text("x")
        paths[name] = str(tmp_path / f"{name}.pem")
    return paths


def test_instruction_required_unless_serving() -> None:
    assert "--instruction" in refused("--intelligence", "test")
    cfg = load_config(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0/mcp"], env={})
    assert cfg.instruction is None
    assert "empty" in refused("--instruction", " ", "--intelligence", "test")


def test_intelligence_required_and_checked() -> None:
    assert "--intelligence is required" in refused("--instruction", "x")
    assert "non-loopback" in refused("--instruction", "x", "--intelligence", "https://a/v1,http://gw.example/v1")
    assert "ftp://gw" in refused("--instruction", "x", "--intelligence", "ftp://gw")
    assert "cannot be combined" in refused("--instruction", "x", "--intelligence", "test,https://a/v1")


def test_reactive_needs_subscribe() -> None:
    assert "--subscribe" in refused(*BASE, "--mode", "reactive")
    fs = ["--mcp", "fs=https://fs.example/mcp"]
    cfg = load_config([*BASE, *fs, "--mode", "reactive", "--subscribe", "file:///inbox", "--subscribe",
                            "fs:file:///b"], env={})
    assert cfg.modes.subscribe == ("file:///inbox", "fs:file:///b")
    assert load_config([*BASE, *fs, "--mode", "reactive", "--continue", "file:///x"], env={}).modes.continue_uris == (
        "file:///x",)
    # No server to own the URIs and nothing to serve: the daemon would idle forever.
    assert "no MCP server is declared" in refused(*BASE, "--mode", "reactive", "--subscribe", "file:///inbox")
    assert "no MCP server is declared" in refused(*BASE, "--mode", "reactive", "--continue", "file:///x")
    served = load_config([*BASE, "--mode", "reactive", "--subscribe", "file:///nowhere",
                               "--serve-mcp", "http://127.0.0.1:0"], env={})
    assert served.modes.subscribe == ("file:///nowhere",)  # serving: it starts, warns reactive.unowned, serves
    assert "URI template" in refused(*BASE, *fs, "--mode", "reactive", "--subscribe", "fs:file:///n/{id}")
    assert "URI template" in refused(*BASE, *fs, "--mode", "reactive", "--continue", "file:///n/{id}")
    assert "needs --mode reactive" in refused(*BASE, "--subscribe", "file:///x")
    assert "not a URI" in refused(*BASE, "--mode", "reactive", "--subscribe", "inbox")
    assert "empty URI" in refused(*BASE, "--mode", "reactive", "--subscribe", "")


def test_split_subscription() -> None:
    servers = ["fs", "gh"]
    assert split_subscription("fs:file:///a", servers) == ("fs", "file:///a")
    assert split_subscription("file:///a", servers) == (None, "file:///a")
    assert split_subscription("other:file:///a", servers) == (None, "other:file:///a")
    assert split_subscription("fs:thing", servers) == (None, "fs:thing")  # scheme fs, not server:uri


def test_schedule_rules() -> None:
    assert "--interval or --cron" in refused(*BASE, "--mode", "schedule")
    assert "mutually exclusive" in refused(*BASE, "--mode", "schedule", "--interval", "5m", "--cron", "* * * * *")
    assert "expected 5 fields" in refused(*BASE, "--mode", "schedule", "--cron", "* * * *")
    assert "bad minute" in refused(*BASE, "--mode", "schedule", "--cron", "61 * * * *")
    assert "--interval > 0" in refused(*BASE, "--mode", "schedule", "--interval", "0")
    assert "needs --mode schedule" in refused(*BASE, "--cron", "* * * * *")
    assert "not a known time zone" in refused(*BASE, "--mode", "schedule", "--cron", "* * * * *", "--cron-tz", "Nowhere/X")
    assert "--cron-tz needs --cron" in refused(*BASE, "--mode", "schedule", "--interval", "5m", "--cron-tz", "UTC")
    assert "needs --mode loop or schedule" in refused(*BASE, "--interval", "5s")
    assert load_config([*BASE, "--mode", "loop", "--interval", "0"], env={}).modes.interval == 0.0
    assert load_config([*BASE, "--mode", "loop"], env={}).modes.interval is None
    assert load_config([*BASE, "--mode", "schedule", "--cron", "*/5 * * * mon-fri"], env={}).modes.cron


def test_numbers() -> None:
    assert "--max-steps must be at least 1" in refused(*BASE, "--max-steps", "0")
    assert "must be >= 0" in refused(*BASE, "--max-children", "-1")
    assert "--deadline must be > 0" in refused(*BASE, "--deadline", "0")
    assert "--poll-interval" in refused(*BASE, "--poll-interval", "0")
    assert load_config([*BASE, "--max-depth", "0"], env={}).subagents.max_depth == 0
    assert "--spawn-rate must be at least 1" in refused(*BASE, "--spawn-rate", "0")


def test_spawn_rate_flags_reach_the_root_supervisors_caps() -> None:
    from agentd.supervisor.wiring import settings_from_config

    caps = settings_from_config(load_config([*BASE, "--spawn-rate", "500", "--spawn-burst", "400"], env={})).caps
    assert (caps.spawn_rate, caps.spawn_burst) == (500.0, 400)


def test_serve_rules(pem: dict[str, str]) -> None:
    assert "needs mTLS (--serve-client-ca) or --serve-bearer" in refused(
        *BASE, "--serve-mcp", "https://0.0.0.0:8443", "--serve-cert", pem["cert"], "--serve-key", pem["key"])
    assert "non-loopback host '0.0.0.0'" in refused(*BASE, "--serve-mcp", "http://0.0.0.0:8080")
    assert "https needs --serve-cert" in refused(*BASE, "--serve-mcp", "https://127.0.0.1:8443")
    assert "need https://" in refused(*BASE, "--serve-mcp", "http://127.0.0.1:1", "--serve-cert", pem["cert"])
    assert "needs --serve-mcp" in refused(*BASE, "--serve-client-ca", pem["ca"])
    assert "--serve-tasks needs --serve-mcp" in refused(*BASE, "--serve-tasks")
    assert "--serve-accept-cancel needs --serve-mcp" in refused(*BASE, "--serve-accept-cancel")
    assert "no such readable file" in refused(*BASE, "--serve-mcp", "https://127.0.0.1:1", "--serve-cert",
                                              "/nonexistent/cert.pem", "--serve-key", pem["key"])
    mtls = load_config([*BASE, "--serve-mcp", "https://0.0.0.0:8443", "--serve-cert", pem["cert"],
                             "--serve-key", pem["key"], "--serve-client-ca", pem["ca"]], env={})
    assert mtls.serve.client_ca == pem["ca"]
    bearer = load_config([*BASE, "--serve-mcp", "https://0.0.0.0:8443", "--serve-cert", pem["cert"],
                               "--serve-key", pem["key"], "--serve-bearer", "{{secret:SERVE_TOKEN}}"],
                              env={"SERVE_TOKEN": "abc"})
    assert bearer.serve.bearer == "{{secret:SERVE_TOKEN}}"
    assert load_config([*BASE, "--serve-mcp", "http://127.0.0.1:0"], env={}).serve.mcp


def test_serve_bearer_must_be_a_reference(pem: dict[str, str]) -> None:
    literal = "hunter2-very-long-token-123"
    message = refused(*BASE, "--serve-mcp", "http://127.0.0.1:1", "--serve-bearer", literal)
    assert "literal secret" in message and literal not in message
    message = refused(*BASE, "--serve-mcp", "http://127.0.0.1:1", "--serve-bearer", "{{secret:NOPE}}")
    assert "NOPE" in message


def test_tls_ca_must_exist(tmp_path: Path) -> None:
    assert "--tls-ca" in refused(*BASE, "--tls-ca", str(tmp_path / "nope.pem"))


def test_check_purpose_needs_servers_only() -> None:
    cfg = load_config(["--mcp", "a=http://127.0.0.1:1/mcp"], {}, purpose="check")
    assert cfg.mcp[0].name == "a" and cfg.instruction is None
    with pytest.raises(ConfigError, match="give something to check"):
        load_config([], {}, purpose="check")


def test_a_remote_http_gateway_is_blamed_on_where_it_was_written(tmp_path: Path) -> None:
    for body in ("intelligence: http://gw.example/v1\n", "intelligence: {url: http://gw.example/v1}\n",
                 "intelligence: [https://a.example/v1, http://gw.example/v1]\n"):
        (tmp_path / "agentd.yaml").write_text("instruction: x\n" + body)
        error = refused("--config", str(tmp_path / "agentd.yaml"))
        assert error.startswith(f"--config {tmp_path / 'agentd.yaml'} $.intelligence: plain http:// to non-loopback")
        assert "--intelligence" not in error
    env_error = refused("--instruction", "x", env={"AGENTD_INTELLIGENCE": "http://gw.example/v1"})
    assert env_error.startswith("$AGENTD_INTELLIGENCE: plain http://")
    assert refused("--instruction", "x", "--intelligence", "http://gw.example/v1").startswith("--intelligence: plain")
