"""``--on-event SERVER:EVENT`` and the config file's ``on_events``: parsed, merged, and every mistake refused
with exit 2 before anything starts (no connection is opened: the declared server's port is closed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentd.config.load import load_config
from agentd.config.model import EventSubscriptionConfig
from agentd.errors import ConfigError

BASE = ["--mcp", "ev=http://127.0.0.1:9/mcp", "--instruction", "x", "--intelligence", "http://127.0.0.1:9/v1"]


def test_flag_alone_is_enough_for_reactive_mode() -> None:
    cfg = load_config(["--mode", "reactive", "--on-event", "ev:ticket.created", *BASE], {})
    assert cfg.modes.on_events == (EventSubscriptionConfig("ev", "ticket.created"),)


def test_file_entries_carry_arguments_and_a_flag_for_the_same_event_is_the_same_subscription(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text("on_events:\n  - {server: ev, event: ticket.created, arguments: {queue: ops}}\n")
    cfg = load_config(["--mode", "reactive", "--config", str(path), "--on-event", "ev:ticket.created",
                       "--on-event", "ev:build.failed", *BASE], {})
    assert cfg.modes.on_events == (EventSubscriptionConfig("ev", "ticket.created", {"queue": "ops"}),
                             EventSubscriptionConfig("ev", "build.failed"))


def test_a_file_entry_may_ask_for_a_delivery_mode(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text("on_events:\n  - {server: ev, event: alert.raised, delivery: webhook}\n")
    cfg = load_config(["--mode", "reactive", "--config", str(path), *BASE], {})
    assert cfg.modes.on_events == (EventSubscriptionConfig("ev", "alert.raised", delivery="webhook"),)


@pytest.mark.parametrize(("argv", "message"), [
    (["--mode", "reactive", "--on-event", "nope:ticket.created"], "no MCP server named 'nope' is declared"),
    (["--mode", "reactive", "--on-event", "ticket.created"], "expected SERVER:EVENT"),
    (["--mode", "reactive", "--on-event", "ev:"], "expected SERVER:EVENT"),
    (["--on-event", "ev:ticket.created"], "--on-event needs --mode reactive"),
])
def test_mistakes_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([*argv, *BASE], {})


@pytest.mark.parametrize(("yaml", "message"), [
    ("on_events: {server: ev}\n", "must be a list"),
    ("on_events:\n  - {server: ev}\n", "'event' must be an event type name"),
    ("on_events:\n  - {server: ev, event: t, arguments: [1]}\n", "'arguments' must be a mapping"),
    ("on_events:\n  - {server: ev, event: t, filter: x}\n", "unknown key 'filter'"),
    ("on_events:\n  - {server: ev, event: t, delivery: email}\n", "'delivery' must be one of poll, push, webhook"),
    ("on_events:\n  - {server: other, event: t}\n", "no MCP server named 'other'"),
])
def test_bad_file_entries_are_config_errors(tmp_path: Path, yaml: str, message: str) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text(yaml)
    with pytest.raises(ConfigError, match=message):
        load_config(["--mode", "reactive", "--config", str(path), *BASE], {})


def test_the_cli_exits_2_naming_the_mistake() -> None:
    proc = subprocess.run([sys.executable, "-m", "agentd", "--mode", "reactive", "--on-event", "nope:t", *BASE],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    [line] = [json.loads(line) for line in proc.stderr.splitlines() if '"config.invalid"' in line]
    assert line["error"] == "--on-event 'nope:t': no MCP server named 'nope' is declared (declared: ev)"


def test_a_server_events_come_from_starts_on_the_2026_wire_unless_pinned_to_2025(tmp_path: Path) -> None:
    from agentd.config.on_events import speaking_events

    config = tmp_path / "c.yaml"
    config.write_text("mcp_servers:\n  - {name: ev, url: 'http://127.0.0.1:9/mcp'}\n"
                      "  - {name: other, url: 'http://127.0.0.1:9/other'}\n")
    cfg = load_config(["--config", str(config), "--mode", "reactive", "--instruction", "x", "--intelligence", "test",
                       "--on-event", "ev:ticket.created"], env={})
    eras = {s.name: s.era for s in speaking_events(cfg.mcp, cfg.modes.on_events)}
    assert eras == {"ev": "modern", "other": "auto"}
    with pytest.raises(ConfigError, match="pinned to the 2025-11-25 protocol"):
        load_config(["--config", str(config), "--mode", "reactive", "--instruction", "x", "--intelligence", "test",
                     "--on-event", "ev:ticket.created", "--mcp-era", "ev=legacy"], env={})
