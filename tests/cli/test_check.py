"""``agentd check`` through the real CLI against the official SDK peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import assert_untouched, run_agentd, tripwire
from tests.peers import launch

pytestmark = pytest.mark.interop


def test_check_reports_a_live_server(sdk_server: launch.PeerProcess) -> None:
    outcome = run_agentd(["check", "--mcp", f"peer={sdk_server.url}"], timeout=60)
    assert outcome.code == 0, outcome.stderr
    (server,) = outcome.document["servers"]
    assert (server["name"], server["endpoint"], server["connected"]) == ("peer", sdk_server.url, True)
    assert server["protocolVersion"] == "2025-11-25" and server["instructions"] == "Test peer instructions."
    assert len(server["tools"]) >= 40  # the session peer has 40 filler tools over 5 pages


def test_check_required_server_down_is_6() -> None:
    port = launch.free_port()
    outcome = run_agentd(["check", "--mcp", f"gone=http://127.0.0.1:{port}/mcp"], timeout=60)
    assert outcome.code == 6
    (server,) = outcome.document["servers"]  # still one JSON document on stdout
    assert server["name"] == "gone" and server["connected"] is False


def test_check_optional_server_down_is_0(tmp_path: Path) -> None:
    port = launch.free_port()
    config = tmp_path / "c.yaml"
    config.write_text(f"mcp_servers:\n  - {{name: gone, url: 'http://127.0.0.1:{port}/mcp', required: false}}\n")
    outcome = run_agentd(["check", "--config", str(config)], timeout=60)
    assert outcome.code == 0
    assert outcome.document["servers"][0]["connected"] is False


def test_check_header_secret_never_in_the_report(sdk_server: launch.PeerProcess, tmp_path: Path) -> None:
    secret = "chk-Secr3t-Vb7Nm2Qa9Lp4"
    config = tmp_path / "c.yaml"
    config.write_text(f"mcp_servers:\n  - name: peer\n    url: {sdk_server.url}\n"
                      "    headers: {X-Api-Key: '{{secret:CHECK_KEY}}'}\n")
    outcome = run_agentd(["check", "--config", str(config), "--log-level", "debug", "--log-content"],
                         env={"CHECK_KEY": secret}, timeout=60)
    assert outcome.code == 0, outcome.stderr
    assert secret not in outcome.stdout + outcome.stderr


def test_check_validate_config_touches_nothing() -> None:
    with tripwire() as sock:
        port = sock.getsockname()[1]
        outcome = run_agentd(["check", "--mcp", f"probe=http://127.0.0.1:{port}/mcp", "--validate-config"])
        assert outcome.code == 0 and outcome.document["valid"] is True
        assert_untouched(sock)
