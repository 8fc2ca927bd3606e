"""Operator endpoints given as DNS names are held to the metadata rule too: the check is on the connected socket.

A network namespace of its own gives this test a real cloud-metadata address (169.254.169.254 on its loopback
device) and an ``/etc/hosts`` in which ``metadata.internal.test`` resolves to it (``ip netns exec`` bind-mounts
``/etc/netns/NAME/hosts``). A TCP listener there records every byte it receives: a refused connection must
carry none, before or after the refusal. agentd runs inside the namespace as a real process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.named_host import events, recording_host, run_agentd

METADATA = "169.254.169.254"
NAME = "metadata.internal.test"
PORT = 8080


@pytest.fixture
def metadata_host(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with recording_host("md", METADATA, NAME, PORT, tmp_path) as host:
        yield host


@pytest.fixture
def namespace(metadata_host: tuple[str, Path]) -> str:
    return metadata_host[0]


@pytest.fixture
def listener(metadata_host: tuple[str, Path]) -> Path:
    """The file the listener on the metadata address appends every byte it receives to."""
    return metadata_host[1]


def test_an_mcp_server_named_by_dns_that_resolves_to_metadata_is_refused_before_a_byte(namespace, listener, tmp_path):
    done = run_agentd(namespace, tmp_path, "--intelligence", "test", "--mcp", f"md=https://{NAME}:{PORT}/mcp")
    assert done.returncode == 6, done.stderr
    assert json.loads(done.stdout)["status"] == "mcp_failed"
    [failed] = events(done.stderr, "mcp.connect_failed")
    assert f"refused to connect to {METADATA}" in str(failed["error"])
    assert "egress.allow" in str(failed["error"])
    assert listener.read_bytes() == b""


def test_a_gateway_named_by_dns_that_resolves_to_metadata_is_refused_before_a_byte(namespace, listener, tmp_path):
    done = run_agentd(namespace, tmp_path, "--intelligence", f"https://{NAME}:{PORT}/v1")
    assert done.returncode == 4, done.stderr
    assert json.loads(done.stdout)["status"] == "intelligence_failed"
    assert f"refused to connect to {METADATA}" in done.stderr
    assert listener.read_bytes() == b""


def test_egress_allow_naming_the_address_lets_the_operator_reach_it(namespace, listener, tmp_path):
    config = tmp_path / "agentd.yaml"
    config.write_text(f"egress:\n  allow: [{METADATA}/32]\n")
    done = run_agentd(namespace, tmp_path, "--config", str(config), "--intelligence", "test",
                   "--mcp", f"md=https://{NAME}:{PORT}/mcp", "--deadline", "3s")  # fmt: skip
    # The listener speaks no TLS, so the run still fails, but this time the connection reached it: its first
    # bytes are a TLS handshake record.
    assert done.returncode in (6, 7), done.stderr
    assert "refused to connect" not in done.stderr
    assert listener.read_bytes()[:2] == b"\x16\x03"
