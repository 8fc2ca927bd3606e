"""A host of its own, named by DNS, that records every byte it is sent: for tests of refusals "before a byte".

A network namespace holds an address on its loopback device and an ``/etc/hosts`` in which a name resolves to
it (``ip netns exec`` bind-mounts ``/etc/netns/NAME/hosts``). A TCP listener there appends every byte it
receives to a file: a refused connection must carry none, before or after the refusal. agentd runs inside the
namespace as a real process (:func:`run_agentd`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.waiting import until_sync

_LISTENER = """
import socket, threading, pathlib, sys
out, ready, address, port = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((address, port)); s.listen(16)
ready.write_text("ok")
def serve(c):
    with c:
        c.settimeout(10)
        try:
            if data := c.recv(65536):  # the first bytes are the record; closing ends the client's handshake now
                with out.open("ab") as f:
                    f.write(data)
        except OSError:
            pass
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def netns_unavailable() -> str | None:
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


@contextmanager
def recording_host(prefix: str, address: str, name: str, port: int, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The namespace's name and the file its listener on ``address:port`` appends every received byte to;
    ``name`` resolves to ``address`` inside it. Skipped (failed under ``AGENTD_TEST_REQUIRE_NETNS=1``) where
    namespaces cannot be made."""
    reason = netns_unavailable()
    if reason is not None:
        if os.environ.get("AGENTD_TEST_REQUIRE_NETNS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    namespace = f"agentd-{prefix}-{os.getpid()}"
    etc = Path("/etc/netns") / namespace
    received, ready = tmp_path / "received", tmp_path / "ready"
    received.write_bytes(b"")
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["ip", "-n", namespace, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", namespace, "addr", "add", f"{address}/32", "dev", "lo"], check=True)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{address} {name}\n")
        process = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", textwrap.dedent(_LISTENER),
                                    str(received), str(ready), address, str(port)])
        def started() -> bool:
            assert process.poll() is None, "the listener died"
            return ready.exists()

        until_sync(started, timeout=10, what="the listener started")
        yield namespace, received
    finally:
        if process is not None:
            process.kill()
            process.wait(5)
        shutil.rmtree(etc, ignore_errors=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def run_agentd(namespace: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``agentd --instruction hi ARGS`` inside ``namespace``, with no proxy variables."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PROXY") and not k.endswith("_proxy")}
    return subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "agentd", "--instruction", "hi", "--deadline", "20s",
         *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip


def events(stderr: str, name: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]
