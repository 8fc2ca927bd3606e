"""``agentd top --tls-ca``: the live tree of a daemon served over https with a private CA, in a real terminal.

The daemon serves in this process (as tests/telemetry/test_events_stream.py does); ``agentd top`` is a real
process on a pseudo-terminal. Without ``--tls-ca`` the same daemon is not trusted, and the status line says
so instead of "connecting" forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from tests.peers.gateway import scripted_gateway, text
from tests.selfmcp.certs import make_pki
from tests.telemetry.test_events_stream import _serving
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]


async def _screen_until(argv: list[str], wanted: list[bytes]) -> bytes:
    """Run ``agentd top`` on a pty until every one of ``wanted`` was drawn, then press q; the screen."""
    master, slave = os.openpty()
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "agentd", "top", *argv], cwd=ROOT,
                                            stdin=slave, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    screen = b""
    try:
        async with trio.lowlevel.FdStream(master) as tty_stream:
            with trio.move_on_after(60):
                while not all(want in screen for want in wanted):
                    screen += await tty_stream.receive_some(65536)
            assert all(want in screen for want in wanted), screen[-2000:]
            with trio.fail_after(30):
                await tty_stream.send_all(b"q")
                assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return screen


async def test_top_connects_to_a_daemon_with_a_private_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    async with scripted_gateway([text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})]) as gw, \
            trio.open_nursery() as nursery:
        base, latch, events = await _serving(nursery, [
            "--instruction", "go", "--intelligence", gw.url, "--serve-mcp", "https://127.0.0.1:0/mcp",
            "--serve-cert", str(pki.server.cert), "--serve-key", str(pki.server.key)], {})
        assert base.startswith("https://")
        await until(lambda: any(e["event"] == "run.end" for e in events), timeout=30, what="run.end")
        untrusted = await _screen_until([base + "/mcp"], [b"certificate not trusted"])
        trusted = await _screen_until([base + "/mcp", "--tls-ca", str(pki.ca)], [b"[connected]", b"completed"])
        latch.request("test")
    assert b"[connected]" not in untrusted
    assert b"agentd top" in trusted and b"steps" in trusted


def test_top_refuses_an_unreadable_ca_before_connecting(tmp_path: Path) -> None:
    from tests.cli.helpers import run_agentd

    out = run_agentd(["top", "https://127.0.0.1:9/mcp", "--tls-ca", str(tmp_path / "missing.pem")], timeout=60)
    assert out.code == 2 and out.stdout == ""
    [event] = out.events
    assert event["event"] == "config.invalid" and "--tls-ca" in event["error"]
