"""Operator endpoints named by DNS that resolve to a private address are refused at connect time, before a byte,
unless ``egress.allow`` names the range (the start-up check only sees address literals: tests/security/test_egress.py).

As in tests/security/test_operator_metadata.py (the harness: tests/security/named_host.py): a network namespace of its own holds the private address (on its
loopback device) and an ``/etc/hosts`` in which ``private.internal.test`` resolves to it; a TCP listener there
records every byte it receives; agentd runs inside the namespace as a real process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.named_host import events, recording_host, run_agentd

PRIVATE = "10.99.0.1"
NAME = "private.internal.test"
PORT = 8080


@pytest.fixture
def private_host(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The namespace's name and the file its listener on ``PRIVATE:PORT`` appends every received byte to."""
    with recording_host("pv", PRIVATE, NAME, PORT, tmp_path) as host:
        yield host


def test_an_mcp_server_named_by_dns_that_resolves_to_a_private_address_is_refused_before_a_byte(
        private_host, tmp_path):
    namespace, received = private_host
    done = run_agentd(namespace, tmp_path, "--intelligence", "test", "--mcp", f"pv=https://{NAME}:{PORT}/mcp")
    assert done.returncode == 6, done.stderr
    assert json.loads(done.stdout)["status"] == "mcp_failed"
    [failed] = events(done.stderr, "mcp.connect_failed")
    assert f"refused to connect to {PRIVATE}" in str(failed["error"])
    assert "egress: {allow: [CIDR]}" in str(failed["error"])
    assert received.read_bytes() == b""


def test_a_gateway_named_by_dns_that_resolves_to_a_private_address_is_refused_before_a_byte(private_host, tmp_path):
    namespace, received = private_host
    done = run_agentd(namespace, tmp_path, "--intelligence", f"https://{NAME}:{PORT}/v1")
    assert done.returncode == 4, done.stderr
    assert f"refused to connect to {PRIVATE}" in done.stderr
    assert received.read_bytes() == b""


def test_egress_allow_naming_the_range_lets_the_operator_reach_it(private_host, tmp_path):
    namespace, received = private_host
    config = tmp_path / "agentd.yaml"
    config.write_text("egress:\n  allow: [10.99.0.0/16]\n")
    done = run_agentd(namespace, tmp_path, "--config", str(config), "--intelligence", "test",
                   "--mcp", f"pv=https://{NAME}:{PORT}/mcp", "--deadline", "45s")  # fmt: skip
    # the listener speaks no TLS (it records the first bytes and closes), so the run still fails, but the
    # connection reached it: a TLS handshake record. The deadline is only a bound: on a loaded machine 3 s
    # could pass before the connection was made.
    assert done.returncode in (6, 7), done.stderr
    assert "refused to connect" not in done.stderr
    assert received.read_bytes()[:2] == b"\x16\x03"
