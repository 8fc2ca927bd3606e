"""Operator endpoints named by DNS that resolve to a private address are refused at connect time, before a byte,
unless ``egress.allow`` names the range (the start-up check only sees address literals: tests/security/test_egress.py).

As in tests/security/test_operator_metadata.py: a network namespace of its own holds the private address (on its
loopback device) and an ``/etc/hosts`` in which ``private.internal.test`` resolves to it; a TCP listener there
records every byte it receives; agentd runs inside the namespace as a real process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.test_operator_metadata import _agentd, _events, _netns_unavailable

PRIVATE = "10.99.0.1"
NAME = "private.internal.test"
PORT = 8080


@pytest.fixture
def private_host(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The namespace's name and the file its listener on ``PRIVATE:PORT`` appends every received byte to."""
    reason = _netns_unavailable()
    if reason is not None:
        if os.environ.get("AGENTD_TEST_REQUIRE_NETNS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"agentd-pv-{os.getpid()}"
    etc = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    received, ready = tmp_path / "received", tmp_path / "ready"
    received.write_bytes(b"")
    script = textwrap.dedent(f"""
        import socket, threading, pathlib
        out = pathlib.Path({str(received)!r})
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(({PRIVATE!r}, {PORT})); s.listen(16)
        pathlib.Path({str(ready)!r}).write_text("ok")
        def serve(c):
            with c:
                c.settimeout(10)
                try:
                    while data := c.recv(65536):
                        with out.open("ab") as f:
                            f.write(data)
                except OSError:
                    pass
        while True:
            c, _ = s.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()
    """)
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", f"{PRIVATE}/32", "dev", "lo"], check=True)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{PRIVATE} {NAME}\n")
        process = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", script])
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert process.poll() is None, "the listener died"
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.02)
        yield name, received
    finally:
        if process is not None:
            process.kill()
            process.wait(5)
        shutil.rmtree(etc, ignore_errors=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_an_mcp_server_named_by_dns_that_resolves_to_a_private_address_is_refused_before_a_byte(
        private_host, tmp_path):
    namespace, received = private_host
    done = _agentd(namespace, tmp_path, "--intelligence", "test", "--mcp", f"pv=https://{NAME}:{PORT}/mcp")
    assert done.returncode == 6, done.stderr
    assert json.loads(done.stdout)["status"] == "mcp_failed"
    [failed] = _events(done.stderr, "mcp.connect_failed")
    assert f"refused to connect to {PRIVATE}" in str(failed["error"])
    assert "egress: {allow: [CIDR]}" in str(failed["error"])
    assert received.read_bytes() == b""


def test_a_gateway_named_by_dns_that_resolves_to_a_private_address_is_refused_before_a_byte(private_host, tmp_path):
    namespace, received = private_host
    done = _agentd(namespace, tmp_path, "--intelligence", f"https://{NAME}:{PORT}/v1")
    assert done.returncode == 4, done.stderr
    assert f"refused to connect to {PRIVATE}" in done.stderr
    assert received.read_bytes() == b""


def test_egress_allow_naming_the_range_lets_the_operator_reach_it(private_host, tmp_path):
    namespace, received = private_host
    config = tmp_path / "agentd.yaml"
    config.write_text("egress:\n  allow: [10.99.0.0/16]\n")
    done = _agentd(namespace, tmp_path, "--config", str(config), "--intelligence", "test",
                   "--mcp", f"pv=https://{NAME}:{PORT}/mcp", "--deadline", "3s")  # fmt: skip
    # the listener speaks no TLS, so the run still fails, but the connection reached it: a TLS handshake record
    assert done.returncode in (6, 7), done.stderr
    assert "refused to connect" not in done.stderr
    assert received.read_bytes()[:2] == b"\x16\x03"
