"""Operator endpoints given as DNS names are held to the metadata rule too: the check is on the connected socket.

A network namespace of its own gives this test a real cloud-metadata address (169.254.169.254 on its loopback
device) and an ``/etc/hosts`` in which ``metadata.internal.test`` resolves to it (``ip netns exec`` bind-mounts
``/etc/netns/NAME/hosts``). A TCP listener there records every byte it receives: a refused connection must
carry none, before or after the refusal. agentd runs inside the namespace as a real process.
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

METADATA = "169.254.169.254"
NAME = "metadata.internal.test"
PORT = 8080


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"agentd-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def namespace(tmp_path: Path) -> Iterator[str]:
    reason = _netns_unavailable()
    if reason is not None:
        if os.environ.get("AGENTD_TEST_REQUIRE_NETNS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"agentd-md-{os.getpid()}"
    etc = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", f"{METADATA}/32", "dev", "lo"], check=True)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{METADATA} {NAME}\n")
        yield name
    finally:
        shutil.rmtree(etc, ignore_errors=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def listener(namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A TCP listener on the metadata address that appends every byte it receives to a file."""
    received = tmp_path / "received"
    received.write_bytes(b"")
    ready = tmp_path / "ready"
    script = textwrap.dedent(f"""
        import socket, threading, pathlib
        out = pathlib.Path({str(received)!r})
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(({METADATA!r}, {PORT})); s.listen(16)
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
    process = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert process.poll() is None, "the listener died"
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.02)
        yield received
    finally:
        process.kill()
        process.wait(5)


def _agentd(namespace: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PROXY") and not k.endswith("_proxy")}
    return subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "agentd", "--instruction", "hi", "--deadline", "20s",
         *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip


def _events(stderr: str, name: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


def test_an_mcp_server_named_by_dns_that_resolves_to_metadata_is_refused_before_a_byte(namespace, listener, tmp_path):
    done = _agentd(namespace, tmp_path, "--intelligence", "test", "--mcp", f"md=https://{NAME}:{PORT}/mcp")
    assert done.returncode == 6, done.stderr
    assert json.loads(done.stdout)["status"] == "mcp_failed"
    [failed] = _events(done.stderr, "mcp.connect_failed")
    assert f"refused to connect to {METADATA}" in str(failed["error"])
    assert "egress.allow" in str(failed["error"])
    assert listener.read_bytes() == b""


def test_a_gateway_named_by_dns_that_resolves_to_metadata_is_refused_before_a_byte(namespace, listener, tmp_path):
    done = _agentd(namespace, tmp_path, "--intelligence", f"https://{NAME}:{PORT}/v1")
    assert done.returncode == 4, done.stderr
    assert json.loads(done.stdout)["status"] == "intelligence_failed"
    assert f"refused to connect to {METADATA}" in done.stderr
    assert listener.read_bytes() == b""


def test_egress_allow_naming_the_address_lets_the_operator_reach_it(namespace, listener, tmp_path):
    config = tmp_path / "agentd.yaml"
    config.write_text(f"egress:\n  allow: [{METADATA}/32]\n")
    done = _agentd(namespace, tmp_path, "--config", str(config), "--intelligence", "test",
                   "--mcp", f"md=https://{NAME}:{PORT}/mcp", "--deadline", "3s")  # fmt: skip
    # The listener speaks no TLS, so the run still fails, but this time the connection reached it: its first
    # bytes are a TLS handshake record.
    assert done.returncode in (6, 7), done.stderr
    assert "refused to connect" not in done.stderr
    assert listener.read_bytes()[:2] == b"\x16\x03"
